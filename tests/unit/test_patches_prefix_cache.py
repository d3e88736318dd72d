"""The prefix_block_drop patch (patches/prefix_cache.py): which engines follow
their blocks, and what a real vLLM KV-cache manager then keeps of a prefix-cache hit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

from vllm_clover.core.checks import CloverStartupError
from vllm_clover.core.prefix_blocks import BlockFollowers
from vllm_clover.patches.prefix_cache import block_followers, follow_blocks

pytestmark = pytest.mark.unit

BLOCK = 4


def kv_cache_config(groups: int = 1) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    specs = [KVCacheGroupSpec([f"layer{g}"], spec) for g in range(groups)]
    return KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=specs)


def vllm_config(method="clover", fuse=True, caching=True):
    heads = SimpleNamespace(fuse_next_token=fuse)
    spec = SimpleNamespace(method=method, draft_model_config=SimpleNamespace(hf_config=heads))
    return SimpleNamespace(
        speculative_config=spec, cache_config=SimpleNamespace(enable_prefix_caching=caching)
    )


def test_only_clover_heads_with_the_fusion_and_prefix_caching_follow_blocks():
    assert isinstance(block_followers(vllm_config(), kv_cache_config()), BlockFollowers)
    assert block_followers(vllm_config(fuse=False), kv_cache_config()) is None
    assert block_followers(vllm_config(caching=False), kv_cache_config()) is None
    assert block_followers(vllm_config(method="eagle"), kv_cache_config()) is None
    assert block_followers(SimpleNamespace(speculative_config=None), kv_cache_config()) is None
    with pytest.raises(CloverStartupError, match="one KV-cache group.*has 2"):
        block_followers(vllm_config(), kv_cache_config(groups=2))


def kv_cache_manager(use_eagle: bool = False) -> KVCacheManager:
    """A real vLLM KV-cache manager with prefix caching (use_eagle: vLLM's block drop)."""
    init_none_hash(sha256)
    return KVCacheManager(
        kv_cache_config(),
        max_model_len=64,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        use_eagle=use_eagle,
    )


@pytest.fixture
def manager():
    """A real vLLM KV-cache manager with prefix caching, its blocks followed."""
    kv = kv_cache_manager()
    follow_blocks(kv, BlockFollowers(BLOCK))
    return kv


def admit(manager, request_id: str, tokens: list[int]) -> tuple[Request, int]:
    """Schedule the request's whole prompt as the scheduler would: its hit, then the rest.
    Returns the request and its hit (tokens)."""
    hasher = get_request_block_hasher(BLOCK, sha256)
    request = Request(request_id, tokens, SamplingParams(max_tokens=8), None, block_hasher=hasher)
    blocks, hit, _ = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is not None
    request.num_computed_tokens = request.num_tokens
    return request, hit


def test_a_hit_keeps_its_last_block_where_the_next_token_is_the_one_it_was_filled_with(manager):
    """The module docstring's example, on vLLM's own manager."""
    admit(manager, "a", [5, 6, 7, 8, 9, 1, 2, 3, 4])
    assert admit(manager, "b", [5, 6, 7, 8, 9, 1, 2, 3, 4, 2])[1] == 8  # both blocks kept
    assert admit(manager, "c", [5, 6, 7, 8, 9, 1, 2, 3, 7, 7])[1] == 4  # block 2 given up
    # c's own copy of the second block, followed by 7, has the same hash as a's; vLLM's
    # lookup finds a's (the first cached), so a request like c gives it up too
    assert admit(manager, "d", [5, 6, 7, 8, 9, 1, 2, 3, 7, 5])[1] == 4


def test_a_block_filled_by_a_decoded_token_is_followed_once_the_next_is_sampled(manager):
    request, _ = admit(manager, "a", [5, 6, 7, 8, 9, 1, 2])  # 7 tokens, then decodes
    request.append_output_token_ids(3)  # the 8th token fills block 2 when it is computed
    manager.allocate_slots(request, 1)
    request.num_computed_tokens += 1
    assert admit(manager, "b", [5, 6, 7, 8, 9, 1, 2, 3, 4])[1] == 4  # follower unknown yet
    request.append_output_token_ids(4)  # sampled, then the request finishes
    manager.free(request)
    assert admit(manager, "c", [5, 6, 7, 8, 9, 1, 2, 3, 4])[1] == 8
    assert admit(manager, "e", [5, 6, 7, 8, 9, 1, 2, 3, 6])[1] == 4


def test_vllm_itself_drops_the_last_block_of_every_hit():
    """What the patch replaces (use_eagle: vLLM's block drop), the same requests as above."""
    manager = kv_cache_manager(use_eagle=True)
    admit(manager, "a", [5, 6, 7, 8, 9, 1, 2, 3, 4])
    assert admit(manager, "b", [5, 6, 7, 8, 9, 1, 2, 3, 4, 2])[1] == 4
