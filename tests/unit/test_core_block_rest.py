"""RestRule and StaleBook (core/block_rest.py): when the Augmenting Block skips its pass,
which requests that leaves stale and which KV pages holed."""

from __future__ import annotations

import pytest

from vllm_clover.core.block_rest import RestRule, StaleBook, Write

pytestmark = pytest.mark.unit

BLOCK = 4


def test_rests_after_22_idle_steps_and_not_while_drafting():
    rule = RestRule()
    assert [rule.rests(0, 1) for _ in range(30)] == [False] * 21 + [True] * 9
    assert rule.rested == 9 and rule.buckets == (1,)
    drafting = RestRule()
    assert not any(drafting.rests(2, 1) for _ in range(40)) and drafting.buckets == ()


def test_would_rest_answers_as_rests_without_recording():
    rule, probe = RestRule(), RestRule()
    for k in [0] * 25 + [1] + [0] * 8:
        answer = probe.would_rest(k, 8)
        assert probe.would_rest(k, 8) == answer  # asking twice records nothing
        assert rule.rests(k, 8) == answer == probe.rests(k, 8)
    assert probe.rested == rule.rested > 0


def test_occasional_exploration_keeps_the_rest():
    rule = RestRule()
    ks = [0] * 22 + [1 if i % 16 == 0 else 0 for i in range(64)]
    rests = [rule.rests(k, 40) for k in ks]
    assert rests[21] and not any(r for r, k in zip(rests, ks, strict=True) if k)
    # the first K = 1 lifts the share for 6 steps; then one idle step after each K = 1 runs
    assert rests[-15:] == [False] + [True] * 14


def test_buckets_rest_apart():
    rule = RestRule()
    for _ in range(30):
        assert not rule.rests(3, 2)  # 2 requests draft ...
        rule.rests(0, 40)  # ... 33-64 do not
    assert rule.buckets == (64,) and not rule.rests(0, 2)


def test_the_docstring_example():
    book = StaleBook(BLOCK)
    book.step(True, [Write("a", 5, 2, [3, 7, 9])])  # positions 5-6: page 7
    assert book.stale == {"a"} and book.holed == {7}
    book.step(False, [Write("a", 8, 1, [3, 7, 9]), Write("c", 0, 1, [20])])
    assert book.holed == {7, 9}
    evicted = []
    book.evict_cached(lambda page: page == 7, evicted.extend)
    assert evicted == [7] and book.holed == {9} and book.evicted == 1


def test_a_page_refilled_by_a_fresh_request_is_clean_again():
    book = StaleBook(BLOCK)
    book.step(True, [Write("a", 0, 6, [5, 6])])
    assert book.holed == {5, 6}
    book.keep_only(["b"])  # a finished; its pages went back to vLLM
    book.step(False, [Write("b", 0, 2, [6])])  # refilled from its slot 0
    book.step(False, [Write("c", 2, 1, [5])])  # written past slot 0: still holed
    assert book.holed == {5} and book.stale == set()


def test_a_stale_request_holes_every_page_it_writes():
    book = StaleBook(BLOCK)
    book.step(True, [Write("a", 3, 1, [1])])
    book.step(False, [Write("a", 4, 9, [1, 2, 3, 4])])  # positions 4-12: pages 2, 3, 4
    assert book.holed == {1, 2, 3, 4}
    book.step(False, [Write("b", 0, 4, [8]), Write("a", 13, 0, [1, 2, 3, 4])])
    assert book.holed == {1, 2, 3, 4} and book.stale == {"a"}


def test_nothing_is_marked_while_the_block_runs_for_fresh_requests():
    book = StaleBook(BLOCK)
    book.step(False, [Write("a", 0, 9, [1, 2, 3]), Write("b", 4, 1, [5, 6])])
    assert book.stale == set() and book.holed == set()
    evicted = []
    book.evict_cached(lambda page: True, evicted.extend)
    assert evicted == [] and book.evicted == 0


def test_all_stale_needs_every_request_stale():
    book = StaleBook(BLOCK)
    assert not book.all_stale([]) and not book.all_stale(["a"])  # nothing stale yet
    book.step(True, [Write("a", 8, 1, [1, 2, 3]), Write("b", 4, 1, [5, 6])])
    assert book.all_stale(["a", "b"]) and book.all_stale(iter(["b"]))
    assert not book.all_stale(["a", "c"])  # c arrived after the rest: it drafts
