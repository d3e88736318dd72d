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
        assert positions.tolist() == positions_of(rows)
        return rows.signal


def test_a_step_without_drafts_runs_prompt_rows_and_keeps_the_others():
    """Request a (a 20-token prompt) decodes at 30, 31 (K = 0, twice), b finishes its
    41-token prompt at 39, 40, then decodes at 41; then a step that drafts runs each one's
    kept rows before its own."""
    deferral, block = BlockDeferral(), RecordingBlock()
    prompt_and_decode = common_metadata(
        query_start_loc_cpu=torch.tensor([0, 1, 3], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        seq_lens=torch.tensor([31, 41], dtype=torch.int32),
    )
    step = step_rows([30, 39, 40])
    kept = run_deferring(
        deferral, block, step, torch.tensor([30, 39, 40]), prompt_and_decode,
        torch.tensor([0, 2]), ["a", "b"], [20, 41], defer=True, limit=64,
    )  # fmt: skip
    assert kept is None and block.passes == [([2], [41], [39, 40])]
    one_row = common_metadata(
        query_start_loc_cpu=torch.tensor([0, 1, 2], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([32, 42], dtype=torch.int32),
    )
    step = step_rows([31, 41])
    kept = run_deferring(
        deferral, block, step, torch.tensor([31, 41]), one_row,
        torch.tensor([0, 1]), ["a", "b"], [20, 41], defer=True, limit=64,
    )  # fmt: skip
    assert kept is None and len(block.passes) == 1  # both past their prompts: nothing ran
    step = step_rows([32, 42])
    h0 = run_deferring(
        deferral, block, step, torch.tensor([32, 42]), common_metadata(
            query_start_loc_cpu=torch.tensor([0, 1, 2], dtype=torch.int32),
            query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
            seq_lens=torch.tensor([33, 43], dtype=torch.int32),
        ),
        torch.tensor([0, 1]), ["a", "b"], [20, 41], defer=False, limit=64,
    )  # fmt: skip
    assert block.passes[-1] == ([3, 2], [33, 43], [30, 31, 32, 41, 42])
    assert h0[:, 0].tolist() == [32, 42]  # each request's last accepted row
    stats = deferral.stats
    assert (stats.deferred, stats.caught_up, stats.prompt_rows, stats.passes) == (3, 3, 2, 1)
