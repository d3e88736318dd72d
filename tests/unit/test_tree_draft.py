import pytest
import torch

from helpers import random_clover, tiny_config
from vllm_clover.tree import TokenTree, TokenTreeError
from vllm_clover.tree.draft import propose_tree

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 1)]")


def _inputs(m: int = 5):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(m, 32, generator=gen), torch.randint(0, 120, (m,), generator=gen)


def _walk(model, h0, t0, path):
    """Reference: draft one node by walking its path a head step at a time: its target
    ids (M,)."""
    loop, tables = model.heads, model.tables
    rows = tables.draft_rows(loop.dtype)
    h, prev = h0, t0
    for depth, rank in enumerate(path):
        h, z = loop.step(depth, h, h0, prev, tables)
        top = rows.logits(z).float().topk(rank + 1, dim=-1)
        prev = tables.draft_to_target(top.indices[:, rank])
    return prev


CLOVER2 = dict(fuse_next_token=True, head_projection="linear")


@pytest.mark.parametrize(("draft_vocab_size", "flags"), [(None, {}), (50, {}), (50, CLOVER2)])
def test_each_node_is_its_paths_walk(draft_vocab_size, flags):
    cfg = tiny_config(draft_vocab_size=draft_vocab_size, **flags)
    model, _ = random_clover(cfg, seed=3, scale=0.5)
    h0, t0 = _inputs()
    drafts = propose_tree(model.heads, h0, t0, TREE, model.tables)  # (M, N)
    assert drafts.shape == (5, TREE.num_nodes)
    for node, path in enumerate(TREE.paths):
        assert torch.equal(drafts[:, node], _walk(model, h0, t0, path)), path
    siblings = drafts[:, TREE.level(1)]
    assert all(len(set(row)) == 3 for row in siblings.tolist())  # ranks give distinct tokens


@pytest.mark.parametrize(("draft_vocab_size", "flags"), [(None, {}), (50, {}), (50, CLOVER2)])
def test_the_chain_tree_drafts_what_propose_drafts(draft_vocab_size, flags):
    cfg = tiny_config(draft_vocab_size=draft_vocab_size, **flags)
    model, _ = random_clover(cfg, seed=4, scale=0.5)
    h0, t0 = _inputs()
    chain = propose_tree(model.heads, h0, t0, TokenTree.chain(3), model.tables)
    assert torch.equal(chain, model.heads.propose(h0, t0, 3, model.tables))


def test_a_tree_deeper_than_the_heads_is_refused():
    model, _ = random_clover(tiny_config(), seed=3)
    h0, t0 = _inputs()
    with pytest.raises(TokenTreeError, match="3 trained heads"):
        propose_tree(model.heads, h0, t0, TokenTree.chain(4), model.tables)
