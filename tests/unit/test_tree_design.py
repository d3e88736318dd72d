import itertools

import pytest

from vllm_clover.tree import TokenTree
from vllm_clover.tree.design import best_tree, expected_tau, path_chance

pytestmark = pytest.mark.unit

ACCURACY = [[0.4, 0.2, 0.1], [0.3, 0.1, 0.05], [0.25, 0.1, 0.05]]


def test_docstring_example():
    acc = [[0.4, 0.2], [0.3, 0.1]]
    tree = best_tree(acc, 3)
    assert str(tree) == "[(0,), (1,), (0, 0)]"
    assert expected_tau(tree, acc) == pytest.approx(1.72)
    assert expected_tau(TokenTree.chain(2), acc) == pytest.approx(1.52)
    assert path_chance((0, 1), acc) == pytest.approx(0.04)


def _closed_trees(candidates, size):
    for subset in itertools.combinations(candidates, size):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in subset):
            yield TokenTree.from_paths(list(subset))


@pytest.mark.parametrize("size", [1, 3, 5])
def test_best_tree_is_the_best_of_every_tree_of_its_size(size):
    candidates = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    best = max(expected_tau(t, ACCURACY) for t in _closed_trees(candidates, size))
    tree = best_tree(ACCURACY, size)
    assert tree.num_nodes == size
    assert expected_tau(tree, ACCURACY) == pytest.approx(best)
    assert expected_tau(tree, ACCURACY) >= expected_tau(TokenTree.chain(min(size, 3)), ACCURACY)


def test_zero_nodes_is_refused():
    with pytest.raises(ValueError, match="at least one node"):
        best_tree(ACCURACY, 0)


def test_best_subtree_keeps_the_most_accepted_nodes():
    from vllm_clover.tree.design import best_subtree

    tree = TokenTree.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]")
    chances = [0.4, 0.2, 0.05, 0.12, 0.06, 0.03]
    assert str(best_subtree(tree, chances, 2)) == "[(0,), (1,)]"
    assert str(best_subtree(tree, chances, 4)) == "[(0,), (1,), (0, 0), (1, 0)]"
    assert best_subtree(tree, chances, 6) == tree
    zero = [0.4, 0.0, 0.0, 0.0, 0.0, 0.0]  # ties at zero: parents before children
    assert str(best_subtree(tree, zero, 3)) == "[(0,), (1,), (2,)]"
