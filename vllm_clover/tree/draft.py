"""Drafting a token tree with the Clover head loop: one head step per depth, batched over
the depth's parent nodes and the requests.

A node's children come from one head step fed with that node (the Regressive Connection
makes a child depend on its parent's token): head step ``d`` reads the state its parent's
step produced and the node's own token, and its top-k draft tokens are the children's, by
rank. The chain is the tree whose every rank is 0, and drafts what ``HeadLoop.propose``
drafts (tested). No KV cache is involved: each step reads one state per node.

Example, the tree ``[(0,), (1,), (0, 0), (0, 1), (1, 0)]`` (nodes n0..n4)::

    step 0 on the root  (h0, t0)           -> top-2 of head 0: n0, n1
    step 1 on n0, n1    (h out of step 0,   -> top-2 of head 1 after n0: n2, n3;
                         tokens n0, n1)        top-1 after n1: n4
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_clover.modeling.head_loop import HeadLoop
from vllm_clover.modeling.tables import TargetTables
from vllm_clover.tree.spec import ROOT, TokenTree
from vllm_clover.tree.subset import PathConfidence


@torch.no_grad()
def propose_tree(
    loop: HeadLoop, h0: torch.Tensor, t0: torch.Tensor, tree: TokenTree, tables: TargetTables
) -> torch.Tensor:
    """Draft target ids of every node: h0 (M, D), t0 (M,) -> (M, N), breadth-first."""
    return _draft(loop, h0, t0, tree, tables, None)


@torch.no_grad()
def propose_confident_tree(
    loop: HeadLoop,
    h0: torch.Tensor,
    t0: torch.Tensor,
    tree: TokenTree,
    tables: TargetTables,
    thresholds: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft the nodes each request is confident in (``tree.subset``): h0 (M, D), t0 (M,),
    thresholds (depths,) the least path probability per depth -> (target ids (M, N), -1 for
    the nodes not drafted; path probabilities (M, N)). A node no request keeps gets no head
    step for its children."""
    confidence = PathConfidence(tree, thresholds, t0.shape[0])
    drafts = _draft(loop, h0, t0, tree, tables, confidence)
    return drafts.masked_fill(~confidence.nodes, -1), confidence.chance[:, 1:]


def _draft(loop, h0, t0, tree, tables, confidence: PathConfidence | None) -> torch.Tensor:
    """The target ids of the nodes, one head step per depth over its source nodes (those
    with children, and with ``confidence`` those some request keeps): (M, N)."""
    cfg = loop.config
    tree.check_fits(cfg.num_heads, cfg.draft_vocab_size or cfg.vocab_size)
    rows, table = tables.draft_rows(loop.dtype), loop.regressive_table(tables)
    h0 = h0.to(loop.dtype)
    m, n = t0.shape[0], tree.num_nodes
    best = torch.zeros(m, n, dtype=torch.long)  # draft-vocab index of each node
    state = torch.zeros(m, n, h0.shape[-1], dtype=h0.dtype)  # h out of each node's parent step
    has_children = set(tree.parents)
    sources = [ROOT]  # the nodes whose children the next head step drafts
    for depth in range(1, tree.depth + 1):
        level = tree.level(depth)
        h_in, prev, kv = _step_inputs(tree, sources, h0, t0, state, best, tables, table)
        h_out, z = loop.step(depth - 1, h_in, h0[:, None].expand_as(h_in), prev, tables, kv)
        ranks = torch.tensor(tree.ranks[level], dtype=torch.long)
        top, probs = _top(rows, z.flatten(0, 1), 1 + int(ranks.max()), confidence is not None)
        column = {s: c for c, s in enumerate(sources)}
        source = torch.tensor([column.get(p, 0) for p in tree.parents[level]])
        best[:, level] = top.view(m, len(sources), -1)[:, source, ranks]
        state[:, level] = h_out[:, source]
        sources = [i for i in range(level.start, level.stop) if i in has_children]
        if confidence is not None:
            drafted = torch.tensor([p in column for p in tree.parents[level]])
            confidence.add_level(depth, probs.view(m, len(column), -1)[:, source, ranks] * drafted)
            sources = confidence.kept_by_any(sources)
        if not sources:
            break
    return tables.draft_to_target(best).long()  # (M, N)


def _top(rows, z: torch.Tensor, width: int, with_probs: bool):
    """The ``width`` best draft-vocabulary indices of each row of z (R, D), and their head
    probabilities (softmax over the draft vocabulary) when asked, else None."""
    if not with_probs:
        return rows.scores(z).topk(width, dim=-1).indices, None
    logits = rows.logits(z).float()  # (R, V_draft)
    top = logits.topk(width, dim=-1)
    return top.indices, torch.exp(top.values - torch.logsumexp(logits, dim=-1, keepdim=True))


def _step_inputs(
    tree: TokenTree,
    sources: list[int],
    h0: torch.Tensor,
    t0: torch.Tensor,
    state: torch.Tensor,
    best: torch.Tensor,
    tables: TargetTables,
    table: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(h_prev (M, S, D), previous target ids (M, S), decoder [k | v] (M, S, 2D) or None) of
    the S source nodes a depth's head step reads."""
    if sources == [ROOT]:
        return h0[:, None], t0[:, None], None
    index = torch.tensor(sources, dtype=torch.long)
    kv = None if table is None else F.embedding(best[:, index], table)
    return state[:, index], tables.draft_to_target(best[:, index]), kv
