"""The Augmenting Block's passes over deferred rows: their layout and attention metadata
(deferred_passes.py)."""

from __future__ import annotations

import pytest
import torch

from helpers import deferred_rows, positions_of, step_rows
from vllm_clover.integration.deferred_block import BlockDeferral, DeferredRows, gather
from vllm_clover.integration.deferred_passes import (
    backlog_passes,
    pass_metadata,
    run_deferring,
    step_pass,
)

pytestmark = pytest.mark.unit


def test_a_backlog_runs_oldest_rows_first_until_the_rest_fits():
    """The docstring's example: limit 4, room 2, deferred counts (3, 5)."""
    taken = [deferred_rows(10, 3), deferred_rows(20, 5)]
    first, second = backlog_passes(taken, [0, 1], limit=4, room=2)
    assert (first.requests, first.query_lens, first.seq_lens) == ([0, 1], [3, 1], [13, 21])
    assert first.positions.tolist() == [10, 11, 12, 20] == positions_of(first.rows)
    assert (second.requests, second.query_lens, second.seq_lens) == ([1], [2], [23])
    assert second.positions.tolist() == [21, 22] == positions_of(second.rows)
    assert taken[0] is None and (taken[1].start, taken[1].count) == (23, 2)
    assert positions_of(gather(taken[1].segments)) == [23, 24]


def test_the_step_pass_puts_each_requests_rows_before_its_scheduled_ones():
    """The docstring's example: scheduled rows qsl (0, 2, 3), deferred counts (1, 2), the
    second request's coming from two earlier steps."""
    older, newer = step_rows([38, 29]), step_rows([39])
    d0, d1 = DeferredRows(29), DeferredRows(38)
    d0.append(older, 1, 2)
    d1.append(older, 0, 1), d1.append(newer, 0, 1)
    step = step_rows([30, 31, 40])
    combined, shifts = step_pass([d0, d1], [0, 1], [0, 2, 3], step, torch.tensor([30, 31, 40]))
    assert combined.positions.tolist() == [29, 30, 31, 38, 39, 40] == positions_of(combined.rows)
    assert (combined.query_lens, combined.seq_lens, shifts.tolist()) == ([3, 3], None, [1, 3])
    last_accepted = torch.tensor([1, 2])  # each request's last accepted row in the step
    assert combined.positions[last_accepted + shifts].tolist() == [31, 40]


def common_metadata(**overrides):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    fields = dict(
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 2, 3], dtype=torch.int32),
        seq_lens=torch.tensor([32, 41], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=3,
        max_query_len=2,
        max_seq_len=41,
        block_table_tensor=torch.tensor([[7, 8, 0], [3, 4, 5]], dtype=torch.int32),
        slot_mapping=torch.tensor([130, 131, 140]),
        is_prefilling=torch.tensor([False, False]),
    )
    return CommonAttentionMetadata(**{**fields, **overrides})


def test_a_backlog_pass_reads_its_requests_block_tables_up_to_its_last_row():
    cad = common_metadata()
    cad.compute_num_computed_tokens()  # a cached lookup the rewrite must not carry over
    backlog = backlog_passes([None, deferred_rows(20, 3)], [0, 1], limit=8, room=0)[0]
    meta = pass_metadata(cad, backlog)
    assert meta.query_start_loc.tolist() == [0, 3] == meta.query_start_loc_cpu.tolist()
    assert (meta.num_reqs, meta.num_actual_tokens, meta.max_query_len) == (1, 3, 3)
    assert meta.seq_lens.tolist() == [23] and meta.max_seq_len == 23
    assert meta.block_table_tensor.tolist() == [[3, 4, 5]]
    assert meta.slot_mapping.tolist() == [120, 121, 122]
    assert meta.is_prefilling.tolist() == [False]
    assert meta.compute_num_computed_tokens().tolist() == [20]


def test_the_step_pass_keeps_every_request_and_its_sequence_length():
    cad = common_metadata()
    step, positions = step_rows([30, 31, 40]), torch.tensor([30, 31, 40])
    combined, _ = step_pass([deferred_rows(29, 1), None], [0, 1], [0, 2, 3], step, positions)
    meta = pass_metadata(cad, combined)
    assert meta.query_start_loc_cpu.tolist() == [0, 3, 4] and meta.num_actual_tokens == 4
    assert meta.seq_lens.tolist() == [32, 41] and meta.block_table_tensor.shape == (2, 3)
    assert meta.slot_mapping.tolist() == [129, 130, 131, 140]
    assert meta.compute_num_computed_tokens().tolist() == [29, 40]


class RecordingBlock:
    """A stand-in for the block: h0 = the rows' signal, each pass recorded as (query
    lengths, sequence lengths, positions)."""

    def __init__(self) -> None:
        self.passes = []

    def __call__(self, rows, positions, cad):
        lens = cad.query_start_loc_cpu.diff().tolist()
        self.passes.append((lens, cad.seq_lens.tolist(), positions.tolist()))
        assert len(lens) == cad.num_reqs == len(cad.block_table_tensor)
        assert positions.tolist() == positions_of(rows)
        return rows.signal


def metadata(starts: list[int], seq_lens: list[int]):
    loc = torch.tensor(starts, dtype=torch.int32)
    return common_metadata(
        query_start_loc=loc, query_start_loc_cpu=loc, seq_lens=torch.tensor(seq_lens)
    )


def step(deferral, block, positions, starts, seq_lens, last, defer):
    """One step of requests a and b at `positions` (block size 4, at most 64 rows a pass)."""
    return run_deferring(
        deferral, block, step_rows(positions), torch.tensor(positions),
        metadata(starts, seq_lens), torch.tensor(last), ["a", "b"], block_size=4,
        defer=defer, limit=64,
    )  # fmt: skip


def test_steps_without_drafts_run_only_the_rows_of_blocks_they_fill():
    """Block size 4. Request a decodes at 6, then 7 and 8 (a verified draft), then 9; b
    ends its prompt at 9 and 10, then decodes at 11 and 12. With K = 0 throughout, rows
    run when their block fills (a's 6-7 when 8 is accepted; b's 9-11 at 11) and the rest
    waits; then a step that drafts runs what waits before its own rows."""
    deferral, block = BlockDeferral(), RecordingBlock()
    assert step(deferral, block, [6, 9, 10], [0, 1, 3], [7, 11], [0, 2], True) is None
    assert block.passes == []
    step(deferral, block, [7, 8, 11], [0, 2, 3], [9, 12], [1, 2], True)  # a: 7, 8 accepted
    assert block.passes == [([2, 3], [8, 12], [6, 7, 9, 10, 11])]
    step(deferral, block, [9, 12], [0, 1, 2], [10, 13], [0, 1], True)
    assert len(block.passes) == 1  # 8-9 and 12 wait: no block filled
    h0 = step(deferral, block, [10, 13], [0, 1, 2], [11, 14], [0, 1], False)
    assert block.passes[-1] == ([3, 2], [11, 14], [8, 9, 10, 12, 13])
    assert h0[:, 0].tolist() == [10, 13]  # each request's last accepted row
    stats = deferral.stats
    assert (stats.deferred, stats.full_block_rows, stats.caught_up) == (8, 5, 8)
    assert (stats.passes, stats.backlog_passes, deferral.waiting) == (1, 1, {})


def test_a_rejected_row_never_runs_and_its_position_is_scheduled_again():
    """Block size 4: a verifies 6, 7, 8 and only 6 is accepted, so 7's and 8's rows are a
    rejected draft's; block 4-7 is not full yet and nothing runs; 7 comes back."""
    deferral, block = BlockDeferral(), RecordingBlock()
    step(deferral, block, [6, 7, 8, 20], [0, 3, 4], [9, 21], [0, 3], True)
    assert block.passes == []
    step(deferral, block, [7, 21], [0, 1, 2], [8, 22], [0, 1], True)  # 7 fills block 4-7
    assert block.passes == [([2], [8], [6, 7])]
    assert deferral.stats.dropped == 2  # the first 7 and 8
