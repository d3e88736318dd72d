"""Which nodes a request drafts under a confidence threshold (path probabilities, kept
nodes always a tree), how they are packed into draft rows, and the inverse map."""

import pytest
import torch

from vllm_clover.tree import TokenTree
from vllm_clover.tree.subset import PathConfidence, confident_nodes, pack, prefix_nodes, rows_of

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0), (0, 1)]")
PROBS = torch.tensor([[0.6, 0.3, 0.5, 0.3], [0.9, 0.05, 0.5, 0.4]])  # the module's example


def test_the_docstring_example():
    confidence = PathConfidence(TREE, torch.tensor([0.2, 0.2]), 2)
    for depth in (1, 2):  # as drafting fills it, a depth at a time
        confidence.add_level(depth, PROBS[:, TREE.level(depth)])
    torch.testing.assert_close(
        confidence.chance[:, 1:],
        torch.tensor([[0.6, 0.3, 0.3, 0.18], [0.9, 0.05, 0.45, 0.36]]),
    )
    kept = confident_nodes(TREE, PROBS, torch.tensor([0.2, 0.2]))
    assert kept.tolist() == [[True, True, True, False], [True, False, True, True]]
    drafts, nodes = pack(torch.tensor([[11, 12, 13, 14]] * 2), kept)
    assert drafts.tolist() == [[11, 12, 13, -1], [11, 13, 14, -1]]
    assert nodes.tolist() == [[0, 1, 2, -1], [0, 2, 3, -1]]
    assert rows_of(nodes, 4).tolist() == [[0, 1, 2, -1], [0, -1, 1, 2]]


def test_thresholds_are_per_depth_and_a_dropped_parent_drops_its_children():
    """A threshold that falls with depth would keep (0, 0) at 0.3 >= 0.25 without (0,),
    whose 0.6 is below 0.7: the parent check drops it."""
    kept = confident_nodes(TREE, PROBS[:1], torch.tensor([0.7, 0.25]))
    assert kept.tolist() == [[False, False, False, False]]
    assert confident_nodes(TREE, PROBS, torch.tensor([0.0, 0.0])).all()


def test_kept_nodes_form_a_tree_and_every_prefix_of_the_packing_too():
    wide = TokenTree.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)]")
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(200, wide.num_nodes, generator=gen)
    kept = confident_nodes(wide, probs, torch.tensor([0.2, 0.1, 0.05]))
    _, nodes = pack(torch.arange(wide.num_nodes).expand(200, -1), kept)
    assert 0 < kept.sum() < kept.numel() and (nodes >= 0).sum() == kept.sum()
    for row in nodes.tolist():
        drafted = [i for i in row if i >= 0]
        assert drafted == sorted(drafted)  # breadth-first
        for cut in range(len(drafted) + 1):
            TokenTree.from_paths([wide.paths[i] for i in drafted[:cut]])  # a tree: no orphan


def test_prefix_nodes_are_the_first_rows():
    assert prefix_nodes(torch.tensor([2, 0]), 3).tolist() == [[0, 1, -1], [-1, -1, -1]]
