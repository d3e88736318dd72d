"""Which path of a drafted tree the target accepts: greedy, and lossless at temperature > 0.

Per request (M of them), over the tree's N nodes breadth-first: drafts (M, N), -1 where none
was drafted, and the target at the root (column 0) and after each node (1 + i): argmax ids
(M, N + 1) for greedy, probabilities (M, N + 1, V) at T > 0 (SpecInfer's multi-draft rule).

How it works: docs/design/drafting.md, "Which path is accepted".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_clover.tree.spec import ROOT, TokenTree


@dataclass(frozen=True)
class TreeVerdict:
    """The target's verdict on M drafted trees.

    path    (M, depth) node indices of the accepted path, -1 past its end
    tokens  (M, depth + 1) the tokens to emit: the path's, then the target's own; -1 after
    """

    path: torch.Tensor
    tokens: torch.Tensor

    def select(self, rows: torch.Tensor) -> TreeVerdict:
        """The verdicts of some requests only (rows (R,) of M)."""
        return TreeVerdict(self.path[rows], self.tokens[rows])

    @property
    def num_accepted(self) -> torch.Tensor:
        """(M,) accepted draft nodes per request (the emitted tokens are one more)."""
        return (self.path >= 0).sum(dim=-1)


def children_table(tree: TokenTree) -> torch.Tensor:
    """(N + 1, C) children of the root (row 0) and of each node (row 1 + i), in rank order,
    -1 padded; C is the most children any node has."""
    rows = [tree.children(ROOT), *(tree.children(i) for i in range(tree.num_nodes))]
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [-1] * (width - len(r)) for r in rows], dtype=torch.long)


def accept_greedy(tree: TokenTree, drafts: torch.Tensor, argmax: torch.Tensor) -> TreeVerdict:
    """Greedy verdict: drafts (M, N), the target's argmax ids (M, N + 1) -> TreeVerdict. A
    node is accepted when its parent is and its token is the target's argmax after the parent
    (worked example: docs/design/drafting.md, "Which path is accepted")."""
    m, n = drafts.shape
    parents = torch.tensor(tree.parents, dtype=torch.long)
    ok = torch.zeros(m, n + 1, dtype=torch.bool)  # column 0: the root, always "accepted"
    ok[:, 0] = True
    for i in range(n):  # parents come first (breadth-first)
        parent = 1 + parents[i]
        ok[:, 1 + i] = ok[:, parent] & (drafts[:, i] == argmax[:, parent]) & (drafts[:, i] >= 0)
    depth = torch.tensor((0, *tree.depths), dtype=torch.long)
    last = torch.where(ok, depth, -1).argmax(dim=-1)  # (M,) column of the deepest accepted
    path = _path_to(tree, last)
    bonus = argmax.gather(1, last[:, None])  # (M, 1) the target's token after it
    return TreeVerdict(path, _emit(drafts, path, bonus))


def accept_sampled(
    tree: TokenTree,
    drafts: torch.Tensor,
    probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> TreeVerdict:
    """Lossless verdict at T > 0: drafts (M, N), target probabilities (M, N + 1, V) after
    every sampling parameter (temperature, top-k, top-p, penalties). The rule and its worked
    example: docs/design/drafting.md, "Which path is accepted"."""
    m = drafts.shape[0]
    rows = torch.arange(m)
    kids = children_table(tree)  # (N + 1, C)
    at = torch.zeros(m, dtype=torch.long)  # column of each request's current node (0: root)
    walking = torch.ones(m, dtype=torch.bool)  # requests whose node accepted a child so far
    emitted = torch.full((m,), -1, dtype=torch.long)
    for _ in range(tree.depth + 1):
        residual = probs[rows, at].clone()  # (M, V) r = p at the current node
        moved = torch.zeros(m, dtype=torch.bool)
        for j in range(kids.shape[1]):
            child = kids[at, j]  # (M,) node index, -1 where this node has no j-th child
            token = drafts[rows, child.clamp(min=0)]
            trying = walking & ~moved & (child >= 0) & (token >= 0)
            mass = residual.sum(dim=-1).clamp(min=torch.finfo(residual.dtype).tiny)
            chance = residual[rows, token.clamp(min=0)] / mass
            u = torch.rand(m, generator=generator, dtype=residual.dtype)
            accepted = trying & (u < chance)
            residual[rows[trying & ~accepted], token[trying & ~accepted]] = 0.0
            at = torch.where(accepted, 1 + child, at)
            moved |= accepted
        done = walking & ~moved  # every child rejected, or a leaf: sample what is left
        if done.any():
            picked = torch.multinomial(residual[done], 1, generator=generator).squeeze(-1)
            emitted[done] = picked
        walking &= moved
        if not walking.any():
            break
    path = _path_to(tree, at)
    return TreeVerdict(path, _emit(drafts, path, emitted[:, None]))


def _path_to(tree: TokenTree, column: torch.Tensor) -> torch.Tensor:
    """(M, depth) node indices from depth 1 to the node at ``column`` (1 + node; 0 = root)."""
    paths = [tree.ancestors(c - 1) if c else () for c in column.tolist()]
    padded = [list(p) + [-1] * (tree.depth - len(p)) for p in paths]
    return torch.tensor(padded, dtype=torch.long).reshape(len(paths), tree.depth)


def _emit(drafts: torch.Tensor, path: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """(M, depth + 1): the path's draft tokens, then ``last`` (M, 1), then -1."""
    m, depth = path.shape
    tokens = torch.full((m, depth + 1), -1, dtype=torch.long)
    length = (path >= 0).sum(dim=-1)  # (M,)
    rows = torch.arange(m)
    tokens[:, :depth] = torch.where(path >= 0, drafts.gather(1, path.clamp(min=0)), -1)
    tokens[rows, length] = last.squeeze(-1)
    return tokens
