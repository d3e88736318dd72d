import pytest
import torch

from vllm_clover.tree.kv import compaction_moves, slots

pytestmark = pytest.mark.unit


def test_moves_of_a_branch_path_and_of_a_chain_prefix():
    path = torch.tensor([[1, 4, -1], [0, 2, 5], [0, -1, -1], [-1, -1, -1]])
    request, source, target = compaction_moves(path)
    assert list(zip(request.tolist(), source.tolist(), target.tolist(), strict=True)) == [
        (0, 2, 1),
        (0, 5, 2),
        (1, 3, 2),
        (1, 6, 3),
    ]  # n0 at offset 1 is already in place; nothing accepted, nothing moves


def test_slots_follow_the_block_table():
    table = torch.tensor([[7, 2, 5], [1, 0, 3]])  # block ids, block size 4
    positions = torch.tensor([[0, 3, 4, 9], [5, 6, 7, 8]])
    assert slots(table, positions, 4).tolist() == [[28, 31, 8, 21], [1, 2, 3, 12]]
