import pytest
import torch

from vllm_clover.tree import ROOT, TokenTree, TokenTreeError

pytestmark = pytest.mark.unit

EXAMPLE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"


def test_parse_numbers_nodes_breadth_first():
    tree = TokenTree.parse([(0, 0, 0), (1, 0), (0,), (0, 1), (1,), [0, 0]])
    assert str(tree) == EXAMPLE
    assert tree == TokenTree.parse(EXAMPLE)
    assert tree.parents == (ROOT, ROOT, 0, 0, 1, 2)
    assert tree.depths == (1, 1, 2, 2, 2, 3) and tree.ranks == (0, 1, 0, 1, 0, 0)
    assert (tree.num_nodes, tree.depth, tree.is_chain) == (6, 3, False)
    assert tree.level(2) == slice(2, 5)
    assert tree.children(ROOT) == (0, 1) and tree.children(0) == (2, 3) and tree.children(5) == ()
    assert tree.ancestors(5) == (0, 2, 5) and tree.ancestors(4) == (1, 4)


def test_chain():
    chain = TokenTree.chain(3)
    assert chain.paths == ((0,), (0, 0), (0, 0, 0)) and chain.is_chain
    assert chain.parents == (ROOT, 0, 1)


def test_ancestor_mask_and_positions_of_the_example():
    tree = TokenTree.parse(EXAMPLE)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_mask, expected)
    assert tree.depths == (1, 1, 2, 2, 2, 3)
    assert torch.equal(TokenTree.chain(3).ancestor_mask, torch.ones(4, 4).tril().bool())


@pytest.mark.parametrize(
    "tree, message",
    [
        ("[(0,), (0, 0, 1)]", r"path \(0, 0, 1\) has no parent: \(0, 0\)"),
        ("[(0,), (0,)]", r"path \(0,\) appears twice"),
        ("[(0,), (1, 0)]", r"path \(1, 0\) has no parent: \(1,\)"),
        ("(0, 1", "not a Python literal"),
        ("[]", "non-empty list of paths"),
        ("[(0,), ()]", "non-empty tuple of ranks"),
        ("[(0,), (-1,)]", "ranks must be integers >= 0"),
        ("[(0.5,)]", "ranks must be integers >= 0"),
    ],
)
def test_malformed_trees_are_named(tree, message):
    with pytest.raises(TokenTreeError, match=message):
        TokenTree.parse(tree)


def test_check_fits_names_the_deep_or_wide_path():
    tree = TokenTree.parse(EXAMPLE)
    tree.check_fits(num_heads=3, draft_vocab_size=2)
    with pytest.raises(TokenTreeError, match=r"path \(0, 0, 0\) is 3 deep .* 2 trained heads"):
        tree.check_fits(num_heads=2, draft_vocab_size=100)
    with pytest.raises(TokenTreeError, match=r"path \(1,\) asks for rank 1 .* from 1 tokens"):
        tree.check_fits(num_heads=4, draft_vocab_size=1)
