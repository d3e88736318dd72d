"""A request's share of the tree: which nodes it drafts, and in which of its rows they sit.

Without a confidence threshold every request drafts the whole tree, or a breadth-first
prefix of it where vLLM schedules fewer drafts (``prefix_nodes``). With one
(``draft_confidence``), each request drafts only the nodes the heads are confident in
(``confident_nodes``): a node is accepted only if its whole path is, so the heads' own
estimate of the chance that it will be accepted is its **path probability**, the product of
the head probabilities of its token and of its ancestors' tokens (each head's softmax over the
draft vocabulary, at the node's rank). A node costs a row of the target's forward whether it
is accepted or not, so it is drafted when that chance is at least the threshold of its depth.
A child's path probability never exceeds its parent's, so with thresholds that do not fall
with depth the kept nodes always form a tree; a node whose parent was dropped is dropped too.

The kept nodes are packed in breadth-first order (``pack``): request m's j-th draft row is
node ``nodes[m, j]``, which vLLM schedules as a chain of that length. A breadth-first order
puts every parent before its children, so any prefix of it, which vLLM may cut the drafts
to, is still a tree. Worked example, the tree ``[(0,), (1,), (0, 0), (0, 1)]`` and threshold
0.2 at every depth::

    node                  n0     n1     n2 (0, 0)   n3 (0, 1)
    head probability      0.6    0.3    0.5         0.3
    path probability      0.6    0.3    0.30        0.18
    kept                  yes    yes    yes         no
    drafts   [11, 12, 13, 14] -> [11, 12, 13, -1]   nodes [0, 1, 2, -1]

With probabilities (0.9, 0.05, 0.5, 0.4) instead: path 0.9, 0.05, 0.45, 0.36; kept n0, n2, n3:
drafts [11, 13, 14, -1], nodes [0, 2, 3, -1], a subset that is not a prefix of the tree.
"""

from __future__ import annotations

import torch

from vllm_clover.tree.spec import TokenTree


def prefix_nodes(num_nodes: torch.Tensor, width: int) -> torch.Tensor:
    """(M, width) node index of each draft row when requests draft breadth-first prefixes:
    num_nodes (M,) -> row j is node j below num_nodes, -1 after. Example, (2, 0) and width
    3: [[0, 1, -1], [-1, -1, -1]]."""
    j = torch.arange(width)
    return torch.where(j[None, :] < num_nodes[:, None], j[None, :], -1)


class PathConfidence:
    """Path probabilities and kept nodes of M requests, filled in a depth at a time (so that
    drafting can skip the head steps of nodes no request keeps). Column 0 is the root
    (probability 1, always kept), column 1 + i node i."""

    def __init__(self, tree: TokenTree, thresholds: torch.Tensor, m: int) -> None:
        self.tree, self.thresholds = tree, thresholds.float().cpu()
        self.chance = torch.ones(m, 1 + tree.num_nodes)
        self.kept = torch.zeros(m, 1 + tree.num_nodes, dtype=torch.bool)
        self.kept[:, 0] = True
        self.parent_columns = 1 + torch.tensor(tree.parents, dtype=torch.long)

    def add_level(self, depth: int, probs: torch.Tensor) -> None:
        """The nodes at ``depth``: probs (M, nodes of the level) their own head
        probabilities (0 where a node was not drafted)."""
        level = self.tree.level(depth)
        columns = torch.arange(level.start, level.stop) + 1
        parents = self.parent_columns[level]
        chance = probs.float().cpu() * self.chance[:, parents]
        self.chance[:, columns] = chance
        self.kept[:, columns] = (chance >= self.thresholds[depth - 1]) & self.kept[:, parents]

    def kept_by_any(self, nodes: list[int]) -> list[int]:
        """The nodes of ``nodes`` that at least one request keeps."""
        return [i for i in nodes if bool(self.kept[:, 1 + i].any())]

    @property
    def nodes(self) -> torch.Tensor:
        """(M, N) bool: the nodes each request drafts."""
        return self.kept[:, 1:]


def confident_nodes(tree: TokenTree, probs: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """(M, N) bool: the nodes each request drafts. probs (M, N) each node's own head
    probability; thresholds (depths,) the least path probability per depth (1-based depth
    d reads entry d - 1). A node is kept when its path probability reaches its depth's
    threshold and its parent is kept (see the module's example)."""
    confidence = PathConfidence(tree, thresholds, probs.shape[0])
    for depth in range(1, tree.depth + 1):
        confidence.add_level(depth, probs[:, tree.level(depth)])
    return confidence.nodes


def pack(drafts: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept nodes first, breadth-first: drafts (M, N) and kept (M, N) -> (the kept drafts
    then -1 (M, N), the node of each of those rows then -1 (M, N)). See the module's
    example."""
    n = drafts.shape[1]
    index = torch.arange(n).expand_as(kept)
    order = torch.where(kept, index, n + index).argsort(dim=-1)  # kept first, in node order
    nodes = torch.where(kept.gather(1, order), order, -1)
    packed = torch.where(nodes >= 0, drafts.gather(1, order), -1)
    return packed, nodes


def rows_of(nodes: torch.Tensor, num_tree_nodes: int) -> torch.Tensor:
    """(M, N) the draft row of each tree node, -1 where a request did not draft it: the
    inverse of ``nodes`` (M, W). Example, nodes [[0, 2, 3, -1]] of a 4-node tree:
    [[0, -1, 1, 2]]."""
    m, width = nodes.shape
    out = torch.full((m, num_tree_nodes + 1), -1, dtype=torch.long)  # last column: -1's sink
    rows = torch.arange(width).expand(m, width)
    out.scatter_(1, torch.where(nodes >= 0, nodes, num_tree_nodes), rows)
    return out[:, :num_tree_nodes]
