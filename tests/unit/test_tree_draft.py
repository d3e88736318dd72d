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
    """Reference: draft one node by walking its path a head step at a time: (its target
    ids (M,), its own head probability (M,), softmax over the draft vocabulary)."""
    loop, tables = model.heads, model.tables
    rows = tables.draft_rows(loop.dtype)
    h, prev = h0, t0
    for depth, rank in enumerate(path):
        h, z = loop.step(depth, h, h0, prev, tables)
        top = rows.logits(z).float().softmax(dim=-1).topk(rank + 1, dim=-1)
        prev, p = tables.draft_to_target(top.indices[:, rank]), top.values[:, rank]
    return prev, p


CLOVER2 = dict(fuse_next_token=True, head_projection="linear")


@pytest.mark.parametrize(("draft_vocab_size", "flags"), [(None, {}), (50, {}), (50, CLOVER2)])
def test_each_node_is_its_paths_walk(draft_vocab_size, flags):
    cfg = tiny_config(draft_vocab_size=draft_vocab_size, **flags)
    model, _ = random_clover(cfg, seed=3, scale=0.5)
    h0, t0 = _inputs()
    drafts = propose_tree(model.heads, h0, t0, TREE, model.tables)  # (M, N)
    assert drafts.shape == (5, TREE.num_nodes)
    for node, path in enumerate(TREE.paths):
        assert torch.equal(drafts[:, node], _walk(model, h0, t0, path)[0]), path
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


def test_a_threshold_drafts_the_confident_subset_of_the_same_tree():
    """With draft_confidence, each request's kept nodes carry the same tokens as the whole
    tree's, the others are -1, and which are kept is confident_nodes of the heads' own
    probabilities at each node (softmax over the draft vocabulary, at the node's rank); the
    path probabilities come back for the drafted nodes."""
    from vllm_clover.tree.draft import propose_confident_tree
    from vllm_clover.tree.subset import PathConfidence, confident_nodes

    model, _ = random_clover(tiny_config(draft_vocab_size=50), seed=3, scale=0.5)
    loop, tables = model.heads, model.tables
    h0, t0 = _inputs(8)
    thresholds = torch.tensor([0.05, 0.02, 0.01])
    whole = propose_tree(loop, h0, t0, TREE, tables)
    pruned, chances = propose_confident_tree(loop, h0, t0, TREE, tables, thresholds)
    kept = pruned >= 0
    assert torch.equal(pruned[kept], whole[kept])
    assert 0 < kept.sum() < kept.numel() and (kept.sum(dim=-1) > 0).all()
    probs = torch.stack([_walk(model, h0, t0, p)[1] for p in TREE.paths], dim=1)
    assert torch.equal(kept, confident_nodes(TREE, probs, thresholds))
    expected = PathConfidence(TREE, thresholds, 8)
    for depth in range(1, TREE.depth + 1):
        expected.add_level(depth, probs[:, TREE.level(depth)])
    torch.testing.assert_close(chances[kept], expected.chance[:, 1:][kept])
