import math

import pytest
import torch

from vllm_clover.tree import TokenTree
from vllm_clover.tree.attention import tree_attention, tree_positions

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")


def _causal(q, k, v, scale):
    """Plain causal attention of the last q.shape[0] positions: q (T, nh, hs), k, v (S, nkv, hs)."""
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1).transpose(0, 1) for x in (k, v))
    scores = torch.einsum("tnh,nsh->nts", q, k) * scale
    t, s = q.shape[0], k.shape[1]
    visible = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
    return torch.einsum("nts,nsh->tnh", scores.masked_fill(~visible, -math.inf).softmax(-1), v)


def test_each_node_attends_as_if_its_path_were_appended_alone():
    gen = torch.Generator().manual_seed(0)
    prefix, t, nh, nkv, hs = 9, TREE.num_nodes + 1, 4, 2, 8
    q = torch.randn(t, nh, hs, generator=gen, dtype=torch.float64)
    k = torch.randn(prefix + t, nkv, hs, generator=gen, dtype=torch.float64)
    v = torch.randn(prefix + t, nkv, hs, generator=gen, dtype=torch.float64)
    out = tree_attention(q, k, v, TREE, scale=hs**-0.5)
    for row in range(t):
        path = [0] + [1 + a for a in (TREE.ancestors(row - 1) if row else ())]
        keys = list(range(prefix)) + [prefix + j for j in path]
        alone = _causal(q[row : row + 1], k[keys], v[keys], hs**-0.5)
        torch.testing.assert_close(out[row], alone[0])


def test_a_chain_is_causal_attention():
    gen = torch.Generator().manual_seed(1)
    chain = TokenTree.chain(3)
    q = torch.randn(4, 2, 8, generator=gen)
    k, v = torch.randn(2, 7, 2, 8, generator=gen)
    torch.testing.assert_close(tree_attention(q, k, v, chain, 0.3), _causal(q, k, v, 0.3))


def test_positions_are_root_plus_depth():
    positions = tree_positions(TREE, torch.tensor([100, 7]))
    assert positions.tolist() == [[100, 101, 101, 102, 102, 102, 103], [7, 8, 8, 9, 9, 9, 10]]
    positions = tree_positions(TREE, torch.tensor([100, 7]), 3)  # the root and n0, n1
    assert positions.tolist() == [[100, 101, 101], [7, 8, 8]]
