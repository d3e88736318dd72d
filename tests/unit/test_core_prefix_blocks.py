"""BlockFollowers (core/prefix_blocks.py): which token followed each cached block,
and which prefix-cache hits keep their last block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.core.prefix_blocks import BlockFollowers

pytestmark = pytest.mark.unit


def blocks(*ids, cached=None):
    """KV blocks with these ids, the first `cached` (default all) carrying a block hash."""
    cached = len(ids) if cached is None else cached
    return [
        SimpleNamespace(block_id=i, block_hash=b"h" if n < cached else None)
        for n, i in enumerate(ids)
    ]


def test_the_docstring_example():
    """The worked example of docs/design/drafting.md, "Prefix-cache blocks and the
    next-token fusion"."""
    followers = BlockFollowers(block_size=4)
    followers.record("a", blocks(10, 11, 12, cached=2), [5, 6, 7, 8, 9, 1, 2, 3, 4])
    assert followers.keeps(10, 9) and followers.keeps(11, 4)
    assert not followers.keeps(11, 7)  # request c: its token after the hit is 7


def test_a_follower_not_yet_sampled_is_recorded_at_a_later_call():
    followers = BlockFollowers(block_size=4)
    tokens = [5, 6, 7, 8, 9, 1, 2, 3]  # block 11 full, the token after it still to be sampled
    followers.record("a", blocks(10, 11), tokens)
    assert followers.keeps(10, 9)
    assert not followers.keeps(11, 4) and not followers.keeps(11, None)
    followers.record("a", blocks(10, 11, 12, cached=2), [*tokens, 4])
    assert followers.keeps(11, 4)


def test_a_refilled_block_forgets_its_old_follower_until_it_has_a_new_one():
    followers = BlockFollowers(block_size=2)
    followers.record("a", blocks(3, 4), [1, 2, 3, 4, 5])
    assert followers.keeps(4, 5)
    followers.forget("a")
    followers.record("b", blocks(7, 4), [1, 2, 8, 8])  # vLLM gave block 4 to b: no follower yet
    assert not followers.keeps(4, 5)
    followers.record("b", blocks(7, 4), [1, 2, 8, 8, 6])
    assert followers.keeps(4, 6)


def test_blocks_are_read_once_per_request_from_where_it_stopped():
    followers = BlockFollowers(block_size=2)
    followers.record("a", blocks(3, 4), [1, 2, 3, 4, 5])
    followers._following[3] = 99  # were block 3 read again, this would be overwritten
    followers.record("a", blocks(3, 4, 5), [1, 2, 3, 4, 5, 6, 7])
    assert followers.keeps(3, 99) and followers.keeps(4, 5) and followers.keeps(5, 7)
    followers.forget("a")  # a new request of the same id starts from its first block
    followers.record("a", blocks(3), [1, 2, 3])
    assert followers.keeps(3, 3)


def test_an_uncached_block_ends_the_walk():
    followers = BlockFollowers(block_size=2)
    followers.record("a", blocks(3, 4, 5, cached=1), [1, 2, 3, 4, 5, 6])
    assert followers.keeps(3, 3)
    assert not followers.keeps(4, 5)  # not cached: nobody can hit it, nothing recorded
