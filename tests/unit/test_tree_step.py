"""A tree step's bookkeeping: which rows are tree rows, their positions, and the gather that
puts accepted paths where a chain's tokens would be."""

import numpy as np
import pytest
import torch

from vllm_clover.tree import TokenTree, TreeVerdict

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0)]")


def _step():
    from vllm_clover.tree.step import TreeStep

    # Three requests: a 5-token prefill chunk (no drafts), 3 nodes, 2 nodes (a BFS prefix).
    return TreeStep.of(TREE, [0, 3, 2], np.array([0, 5, 9, 12]))


def test_rows_of_the_tree_requests():
    step = _step()
    assert step.requests.tolist() == [1, 2] and step.roots.tolist() == [5, 9]
    rows, real = step.rows
    assert rows.tolist() == [[5, 6, 7, 8], [9, 10, 11, 9]]
    assert real.tolist() == [[True] * 4, [True, True, True, False]]
    targets, where = step.targets
    assert targets.tolist() == [5, 6, 7, 8, 9, 10, 11]
    assert rows[where].tolist() == targets.tolist()


def test_the_kernel_runs_only_when_other_rows_share_the_step():
    """The prefill chunk's 5 rows need vLLM's causal kernel; a step of tree rows alone does
    not."""
    from vllm_clover.tree.step import TreeStep

    assert not _step().covers(12)
    assert TreeStep.of(TREE, [3, 2], np.array([0, 4, 7])).covers(7)
    assert TreeStep.of(TREE, [3, 3], np.array([0, 4, 8])).covers(8)


def test_no_drafts_no_step():
    from vllm_clover.tree.step import TreeStep

    assert TreeStep.of(TREE, [0, 0], np.array([0, 3, 4])) is None


def test_positions_become_root_plus_depth():
    step = _step()
    positions = torch.tensor([0, 1, 2, 3, 4, 40, 41, 42, 43, 70, 71, 72])
    step.set_positions(positions)
    assert positions.tolist() == [0, 1, 2, 3, 4, 40, 41, 41, 42, 70, 71, 71]


def test_chain_order_moves_accepted_paths_after_their_roots():
    step = _step()
    step.settle(TreeVerdict(torch.tensor([[1, -1], [0, -1]]), torch.tensor([[8, 3, -1]] * 2)))
    order = step.chain_order(12)
    assert order.tolist() == [0, 1, 2, 3, 4, 5, 7, 7, 8, 9, 10, 11]  # n1 (row 7) to row 6
    step.settle(TreeVerdict(torch.tensor([[0, 2], [-1, -1]]), torch.tensor([[8, 3, 1]] * 2)))
    assert step.chain_order(12).tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 8, 9, 10, 11]
    step.settle(TreeVerdict(torch.tensor([[0, -1], [0, -1]]), torch.tensor([[8, 3, -1]] * 2)))
    assert step.chain_order(12) is None  # rank-0 paths are already where a chain's are


def test_verifier_counts_paths_off_the_chain_and_by_depth():
    from vllm_clover.tree.step import TreeVerifier

    trees = TreeVerifier(TREE)
    num_nodes = torch.tensor([3, 3, 1])  # the third drafted n0 only (its token limit)
    verdict = TreeVerdict(torch.tensor([[1, -1], [0, 2], [-1, -1]]), torch.zeros(3, 3))
    trees.record(verdict, num_nodes)
    assert (trees.verified, trees.off_chain, trees.accepted_by_depth) == (3, 1, [2, 1])
    assert trees.accepted_by_node == [1, 1, 1] and trees.drafted_by_node == [3, 2, 2]
