"""Rows parked under full KV blocks: keyed by block, found through block tables, dropped when
a block is written again (parked_blocks.py). The step-level flow is in
test_integration_deferred_passes.py, the engine tests in tests/engine/test_clover_budget.py."""

from __future__ import annotations

import pytest
import torch

from vllm_clover.integration.parked_blocks import BlockInput, ParkedBlocks

pytestmark = pytest.mark.unit


def rows(start: int, count: int, slot_offset: int = 100) -> BlockInput:
    """Rows at positions start.. whose x names the position and whose slot is position +
    slot_offset (block size 4, offset 100: position p in block 25 + p // 4)."""
    p = torch.arange(start, start + count)
    return BlockInput(start, torch.stack([p.float(), p.float()], dim=-1), p + slot_offset)


def positions(block_input: BlockInput | None) -> list[int] | None:
    return None if block_input is None else block_input.x[:, 0].long().tolist()


def test_rows_are_parked_per_block_they_fall_in():
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(6, 6))  # positions 6-11: blocks 26 (6-7) and 27 (8-11)
    assert {block: positions(r) for block, r in parked.blocks.items()} == {
        26: [6, 7],
        27: [8, 9, 10, 11],
    }
    assert parked.rows == 6 and parked.blocks[27].slots.tolist() == [108, 109, 110, 111]


def test_a_request_claims_the_parked_blocks_right_before_its_rows():
    """The docstring's example, ends (8, 6): request 0 reads blocks 25, 26 (positions 0-7),
    both parked; request 1 ends inside a block."""
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(0, 8))
    tables = torch.tensor([[25, 26, 40], [25, 26, 41]])
    first, second = parked.claim(tables, [8, 6])
    assert positions(first) == list(range(8)) and first.start == 0 and second is None
    assert first.slots.tolist() == list(range(100, 108))
    assert parked.blocks == {} and parked.rows == 0


def test_a_chain_stops_at_a_gap_and_at_rows_that_ran():
    """Block 27 (8-11) is not parked: a request whose own rows begin at 16 finds block 28
    (12-15) only, and block 26, parked from 6 (4-5 ran), ends what a request at 8 reads."""
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(6, 2))
    parked.park(rows(12, 4))
    tables = torch.tensor([[25, 26, 27, 28, 29], [25, 26, 31, 32, 33]])
    late, early = parked.claim(tables, [16, 8])
    assert positions(late) == [12, 13, 14, 15] and positions(early) == [6, 7]
    assert parked.blocks == {}


def test_two_requests_reading_one_block_both_run_it():
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(4, 4))
    tables = torch.tensor([[25, 26, 40], [25, 26, 41]])
    assert [positions(r) for r in parked.claim(tables, [8, 8])] == [[4, 5, 6, 7]] * 2
    assert parked.rows == 0


def test_a_claim_reads_the_rows_of_the_step_requests_only():
    """The runner's table has a row per request it can hold and an entry per block of the
    longest context; a step claims through its own requests' rows (none: nothing)."""
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(0, 4))
    tables = torch.full((8, 64), -1)
    tables[0, :2] = torch.tensor([25, 26])
    assert parked.claim(tables, []) == [] and parked.rows == 4
    assert [positions(r) for r in parked.claim(tables, [4])] == [[0, 1, 2, 3]]


def test_a_block_is_found_by_its_table_entry_not_by_position():
    """Block 26 parked for positions 4-7 sits at entry 2 of another table (positions 8-11):
    not the same rows, so nothing is claimed and it stays parked."""
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(4, 4))
    assert parked.claim(torch.tensor([[30, 31, 26]]), [12]) == [None]
    assert list(parked.blocks) == [26]


def test_a_block_written_again_loses_what_was_parked_there():
    parked = ParkedBlocks(block_size=4)
    parked.park(rows(4, 8))  # blocks 26 and 27
    assert parked.release(torch.tensor([105, 300])) == 4  # a step writes into block 26
    assert list(parked.blocks) == [27] and parked.rows == 4
    assert parked.release(torch.tensor([400])) == 0
