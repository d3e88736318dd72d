"""The Augmenting Block's passes over deferred rows: their layout and attention metadata
(deferred_passes.py)."""

from __future__ import annotations

import pytest
import torch

from helpers import deferred_rows, positions_of, step_rows
from vllm_clover.integration.deferred_block import BlockDeferral, DeferredRows, StepRows, gather
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
    """A stand-in for the block: h0 = x, each pass recorded as (query lengths, sequence
    lengths, positions); x's first column must name each row's position."""

    def __init__(self) -> None:
        self.passes = []

    def __call__(self, x, slots, positions, cad):
        lens = cad.query_start_loc_cpu.diff().tolist()
        self.passes.append((lens, cad.seq_lens.tolist(), positions.tolist()))
        assert len(lens) == cad.num_reqs == len(cad.block_table_tensor)
        assert positions.tolist() == x[:, 0].long().tolist()
        assert slots.tolist() == cad.slot_mapping.tolist()
        return x


# Requests a and b in KV blocks of 4 positions: a's slot is its position + 100 (blocks 25,
# 26, ...), b's its position + 200 (blocks 50, 51, ...), unless a test shares or reuses them.
TABLES = [[25 + j for j in range(8)], [50 + j for j in range(8)]]


def step(
    deferral, block, a, b, defer, last=(-1, -1), tables=TABLES, offsets=(100, 200), ids="ab",
    drafting=None,
):  # fmt: skip
    """One step scheduling a at positions `a` and b at `b` (at most 64 rows a pass), whose
    last accepted rows are last[i] of each (by default their last scheduled ones); `ids`
    names the two requests, `drafting` the runner rows that draft (None: both)."""
    positions = torch.tensor(a + b)
    slots = torch.tensor([p + offsets[0] for p in a] + [p + offsets[1] for p in b])
    signal = torch.stack([positions.float(), torch.full_like(positions, 7).float()], dim=-1)
    loc = torch.tensor([0, len(a), len(a) + len(b)], dtype=torch.int32)
    cad = common_metadata(
        query_start_loc=loc,
        query_start_loc_cpu=loc,
        seq_lens=torch.tensor([a[-1] + 1, b[-1] + 1]),
        block_table_tensor=torch.tensor(tables),
        slot_mapping=slots,
    )
    rows = [(last[0] % len(a)), len(a) + last[1] % len(b)]
    return run_deferring(
        deferral, block, lambda rows: rows.signal, StepRows(signal, positions + 1, slots),
        positions, cad, torch.tensor(rows), list(ids), block_size=4, defer=defer, limit=64,
        drafting=drafting,
    )  # fmt: skip


def test_steps_without_drafts_park_the_rows_of_blocks_they_fill():
    """Block size 4. Request a decodes at 6, then 7 and 8 (a verified draft), then 9; b
    ends its prompt at 9 and 10, then decodes at 11 and 12. With K = 0 throughout nothing
    runs: the rows of each block that fills are parked (a's 6-7 when 8 is accepted, b's
    9-11 at 11), the rest waits; then a step that drafts runs the parked rows in a pass of
    their own, and the waiting ones before its own rows."""
    deferral, block = BlockDeferral(block_size=4), RecordingBlock()
    assert step(deferral, block, [6], [9, 10], True) is None
    step(deferral, block, [7, 8], [11], True)
    step(deferral, block, [9], [12], True)
    assert block.passes == []
    assert {k: (v.start, v.count) for k, v in deferral.parked.blocks.items()} == {
        26: (6, 2),  # a's block 4-7
        52: (9, 3),  # b's block 8-11 (8 ran before)
    }
    h0 = step(deferral, block, [10], [13], False)
    assert block.passes == [
        ([2, 3], [8, 12], [6, 7, 9, 10, 11]),
        ([3, 2], [11, 14], [8, 9, 10, 12, 13]),
    ]
    assert h0[:, 0].tolist() == [10, 13]  # each request's last accepted row
    stats = deferral.stats
    assert (stats.deferred, stats.parked, stats.caught_up) == (8, 5, 8)
    assert (stats.passes, stats.backlog_passes, deferral.waiting, deferral.parked.rows) == (
        1, 1, {}, 0,
    )  # fmt: skip


def test_a_request_runs_the_rows_parked_in_the_blocks_it_shares():
    """a fills block 26 (positions 4-7) at K = 0 and finishes; b's prompt shares a's
    first 8 positions (prefix caching gives it blocks 25 and 26): when b drafts from
    position 8, the rows a parked run first, as b's, in a's slots; c runs its own."""
    deferral, block = BlockDeferral(block_size=4), RecordingBlock()
    step(deferral, block, [4, 5, 6, 7], [30], True, ids="ac")  # a ran 0-3 when it drafted
    deferral.forget({"c"})
    shared = [[25, 26, 53, 54, 55, 56, 57, 58], TABLES[1]]
    step(deferral, block, [8, 9], [31], False, tables=shared, ids="bc")
    assert block.passes == [([4], [8], [4, 5, 6, 7]), ([2, 2], [10, 32], [8, 9, 30, 31])]
    assert deferral.stats.caught_up == 4 + 1 and deferral.parked.blocks == {}


def test_rows_parked_in_a_block_written_again_are_dropped():
    """a parks block 26 and finishes; vLLM then gives the block to c (its slots 104-106
    hold c's positions 0-2): what a parked there is gone, and nothing runs."""
    deferral, block = BlockDeferral(block_size=4), RecordingBlock()
    step(deferral, block, [4, 5, 6, 7], [29], True)
    deferral.forget({"b"})
    step(deferral, block, [0, 1, 2], [30], True, offsets=(104, 200), ids="cb")
    assert deferral.parked.blocks == {} and deferral.stats.dropped == 4
    assert block.passes == []


def test_a_rejected_row_never_runs_and_its_position_is_scheduled_again():
    """Block size 4: a verifies 6, 7, 8 and only 6 is accepted, so 7's and 8's rows are a
    rejected draft's; block 4-7 is not full yet and nothing is parked; 7 comes back."""
    deferral, block = BlockDeferral(block_size=4), RecordingBlock()
    step(deferral, block, [6, 7, 8], [20], True, last=(0, 0))
    assert deferral.parked.blocks == {}
    step(deferral, block, [7], [21], True)  # 7 fills block 4-7
    assert (deferral.parked.blocks[26].start, deferral.parked.blocks[26].count) == (6, 2)
    assert deferral.stats.dropped == 2  # the first 7 and 8
    assert block.passes == []


def test_a_trial_runs_the_drafting_requests_rows_and_keeps_the_others():
    """Block size 4, a subset trial drafting for one of a and b at a time. Step 1 (K = 0):
    both wait. Step 2, b drafts: b's 20 runs before its 21 in a pass of b alone, a's 6
    waits with its 5. Step 3, a drafts: a's 5, 6 run before 7; b verifies a draft (22, 23),
    which fills its block 20-23, so 22-23 are parked. Step 4, both draft: b runs the parked
    rows first, then each request its own. h0 has a row per drafting request."""
    deferral, block = BlockDeferral(block_size=4), RecordingBlock()
    assert step(deferral, block, [5], [20], True) is None
    h0 = step(deferral, block, [6], [21], False, drafting=[1])
    assert block.passes == [([2], [22], [20, 21])] and h0[:, 0].tolist() == [21]
    assert (deferral.waiting["a"].start, deferral.waiting["a"].count) == (5, 2)
    h0 = step(deferral, block, [7], [22, 23], False, drafting=[0])
    assert block.passes[1:] == [([3], [8], [5, 6, 7])] and h0[:, 0].tolist() == [7]
    assert (deferral.parked.blocks[55].start, deferral.parked.blocks[55].count) == (22, 2)
    h0 = step(deferral, block, [8], [24], False)
    assert block.passes[2:] == [([2], [24], [22, 23]), ([1, 1], [9, 25], [8, 24])]
    assert h0[:, 0].tolist() == [8, 24]
    stats = deferral.stats
    assert (stats.deferred, stats.parked, stats.caught_up) == (5, 2, 5)
    assert deferral.waiting == {} and deferral.parked.blocks == {}
