"""Drafting a token tree with the Clover head loop: one head step per depth, batched over
the depth's parent nodes and the requests.

A node's children are, by rank, the top-k tokens of one head step fed with that node (the
Regressive Connection). The all-rank-0 tree drafts what ``HeadLoop.propose`` drafts (tested).

How it works: docs/design/drafting.md, "Drafting a tree".
"""

from __future__ import annotations

import torch

from vllm_clover.modeling.head_loop import HeadLoop
from vllm_clover.modeling.tables import TargetTables
from vllm_clover.tree.spec import ROOT, TokenTree


@torch.no_grad()
def propose_tree(
    loop: HeadLoop, h0: torch.Tensor, t0: torch.Tensor, tree: TokenTree, tables: TargetTables
) -> torch.Tensor:
    """Draft target ids of every node: h0 (M, D), t0 (M,) -> (M, N), breadth-first, one
    head step per depth over its source nodes (those with children)."""
    cfg = loop.config
    tree.check_fits(cfg.num_heads, cfg.draft_vocab_size or cfg.vocab_size)
    rows = tables.draft_rows(loop.dtype)
    h0 = h0.to(loop.dtype)
    m, n = t0.shape[0], tree.num_nodes
    best = torch.zeros(m, n, dtype=torch.long)  # draft-vocab index of each node
    state = torch.zeros(m, n, h0.shape[-1], dtype=h0.dtype)  # h out of each node's parent step
    has_children = set(tree.parents)
    sources = [ROOT]  # the nodes whose children the next head step drafts
    for depth in range(1, tree.depth + 1):
        level = tree.level(depth)
        h_in, prev = _step_inputs(tree, sources, h0, t0, state, best, tables)
        h_out, z = loop.step(depth - 1, h_in, h0[:, None].expand_as(h_in), prev, tables)
        ranks = torch.tensor(tree.ranks[level], dtype=torch.long)
        top = rows.scores(z.flatten(0, 1)).topk(1 + int(ranks.max()), dim=-1).indices
        column = {s: c for c, s in enumerate(sources)}
        source = torch.tensor([column.get(p, 0) for p in tree.parents[level]])
        best[:, level] = top.view(m, len(sources), -1)[:, source, ranks]
        state[:, level] = h_out[:, source]
        sources = [i for i in range(level.start, level.stop) if i in has_children]
        if not sources:
            break
    return tables.draft_to_target(best).long()  # (M, N)


def _step_inputs(
    tree: TokenTree,
    sources: list[int],
    h0: torch.Tensor,
    t0: torch.Tensor,
    state: torch.Tensor,
    best: torch.Tensor,
    tables: TargetTables,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_prev (M, S, D), previous target ids (M, S)) of the S source nodes a depth's head
    step reads."""
    if sources == [ROOT]:
        return h0[:, None], t0[:, None]
    index = torch.tensor(sources, dtype=torch.long)
    return state[:, index], tables.draft_to_target(best[:, index])
