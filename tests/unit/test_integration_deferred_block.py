"""The Augmenting Block's deferred rows: what is kept and what is dropped
(deferred_block.py); the engine test of the whole (same drafts with and without deferral)
is in tests/engine/test_clover_budget.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import positions_of, step_rows
from vllm_clover.integration.deferred_block import (
    BlockDeferral,
    block_deferral,
    gather,
    next_token_ids_after,
)

pytestmark = pytest.mark.unit


def test_the_token_after_each_position_is_the_next_scheduled_or_the_sampled_one():
    """The docstring's example: [a1 a2 | b1], last accepted (1, 2), sampled (a3, b2)."""
    a1, a2, a3, b1, b2 = 11, 12, 13, 21, 22
    ids = next_token_ids_after(
        torch.tensor([a1, a2, b1]), torch.tensor([a3, b2]), torch.tensor([1, 2])
    )
    assert ids.tolist() == [a2, a3, b2]


def test_rows_wait_per_request_until_a_step_takes_them():
    deferral = BlockDeferral(block_size=4)
    first = step_rows([10, 20, 21])  # request a at position 10, b at 20 and 21 (its prompt)
    deferral.defer(["a", "b"], [10, 20], [(0, 1), (1, 3)], first)
    first.slots[:] = -1  # the runner reuses its buffers: what was kept must not change
    deferral.defer(["a", "b"], [11, 22], [(0, 1), (1, 2)], step_rows([11, 22]))
    a, b = deferral.take(["a", "b"], [12, 23])
    assert (a.start, a.count, b.start, b.count) == (10, 2, 20, 3)
    assert positions_of(gather(b.segments)) == [20, 21, 22]
    assert positions_of(gather(a.segments)) == [10, 11]
    assert deferral.waiting == {} and deferral.take(["a"], [13]) == [None]
    assert (deferral.stats.deferred, deferral.stats.caught_up, deferral.stats.dropped) == (5, 5, 0)


def test_gathered_rows_keep_the_segments_order_across_interleaved_steps():
    """The docstring's example (both steps give fewer than half their rows, so both are
    cut to those rows before they are concatenated); then a step given whole (half its rows
    or more) next to a cut one, and a step given whole alone."""
    s1, s2 = step_rows(list(range(10, 18))), step_rows([30, 31, 32, 33, 34, 35])
    rows = gather([(s1, 0, 2), (s2, 5, 6), (s1, 7, 8)])
    assert positions_of(rows) == [10, 11, 35, 17]
    assert rows.signal[:, 1].tolist() == [7.0] * 4  # every column, whole rows
    assert positions_of(gather([(s2, 1, 3), (s1, 4, 5), (s2, 3, 4)])) == [31, 32, 14, 33]
    assert positions_of(gather([(s1, 2, 3), (s1, 5, 8)])) == [12, 15, 16, 17]


def test_rows_read_once_per_step_come_as_slices_in_order():
    """A block that fills at a decode step reads one row of each step since it began: every
    step read once gives its slice (copied once, by the concatenation); a step read by two
    segments among steps read once keeps its place in the segments' order."""
    steps = [step_rows([10 + i, 20 + i, 30 + i]) for i in range(5)]
    rows = gather([(step, 1, 2) for step in steps])  # request b's row of each step
    assert positions_of(rows) == [20, 21, 22, 23, 24]
    steps[0].slots[:] = -1  # the gathered rows are a copy: the steps may change after
    assert positions_of(rows) == [20, 21, 22, 23, 24]
    assert positions_of(gather([(steps[1], 0, 1)])) == [11]  # one segment alone
    mixed = gather([(steps[1], 0, 1), (steps[2], 2, 3), (steps[1], 2, 3), (steps[3], 0, 2)])
    assert positions_of(mixed) == [11, 32, 31, 13, 23]


def test_rows_scheduled_again_are_dropped():
    """A step verifying drafts schedules 10, 11, 12; 11 and 12 are rejected, so the next
    step schedules 11 again: only 10's row is still the block's to run."""
    deferral = BlockDeferral(block_size=4)
    deferral.defer(["a"], [10], [(0, 3)], step_rows([10, 11, 12]))
    (a,) = deferral.take(["a"], [11])
    assert (a.start, a.count, positions_of(gather(a.segments))) == (10, 1, [10])
    assert deferral.stats.dropped == 2


def test_rows_a_request_cannot_run_in_one_query_are_dropped():
    """Rows that do not end right before the first scheduled position (all of them
    scheduled again, a preempted request recomputed from 0; or a gap) are dropped."""
    deferral = BlockDeferral(block_size=4)
    deferral.defer(["a", "b"], [10, 20], [(0, 2), (2, 4)], step_rows([10, 11, 20, 21]))
    assert deferral.take(["a", "b"], [0, 25]) == [None, None]
    assert deferral.stats.dropped == 4


def test_finished_requests_rows_are_forgotten():
    deferral = BlockDeferral(block_size=4)
    deferral.defer(["a", "b"], [10, 20], [(0, 1), (1, 2)], step_rows([10, 20]))
    deferral.forget({"b": object()})
    assert list(deferral.waiting) == ["b"] and deferral.stats.dropped == 1


def vllm_config(async_scheduling=False, batches=1, dp=1, defer_block=None, layers=2):
    hf_config = SimpleNamespace(use_augmenting_block=layers > 0, num_augmenting_layers=layers)
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            draft_model_config=SimpleNamespace(hf_config=hf_config), defer_block=defer_block
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        max_concurrent_batches=batches,
        parallel_config=SimpleNamespace(data_parallel_size=dp),
        cache_config=SimpleNamespace(block_size=16),
    )


@pytest.mark.parametrize(
    ("settings", "trees"),
    [
        ({"layers": 0}, False),  # nothing to defer
        ({"defer_block": False}, False),
        ({}, True),
        ({"async_scheduling": True}, False),
        ({"batches": 2}, False),
        ({"dp": 2}, False),
    ],
)
def test_deferral_is_off_where_it_cannot_apply(settings, trees):
    assert block_deferral(vllm_config(**settings), trees) is None


def test_deferral_is_on_by_default():
    assert isinstance(block_deferral(vllm_config(), False), BlockDeferral)
    assert isinstance(block_deferral(vllm_config(defer_block=True), False), BlockDeferral)
