"""A request's share of the tree: which nodes its draft rows are.

A request drafts the whole tree, or a breadth-first prefix of it where vLLM schedules fewer
drafts (``prefix_nodes``). A breadth-first order puts every parent before its children, so
any prefix of it, which vLLM may cut the drafts to, is still a tree. ``nodes`` (M, W), the
node of each request's draft row (-1 past its last), is what the tree's attention, sampler
and compaction read.
"""

from __future__ import annotations

import torch


def prefix_nodes(num_nodes: torch.Tensor, width: int) -> torch.Tensor:
    """(M, width) node index of each draft row when requests draft breadth-first prefixes:
    num_nodes (M,) -> row j is node j below num_nodes, -1 after. Example, (2, 0) and width
    3: [[0, 1, -1], [-1, -1, -1]]."""
    j = torch.arange(width)
    return torch.where(j[None, :] < num_nodes[:, None], j[None, :], -1)


def rows_of(nodes: torch.Tensor, num_tree_nodes: int) -> torch.Tensor:
    """(M, N) the draft row of each tree node, -1 where a request did not draft it: the
    inverse of ``nodes`` (M, W). Example, nodes [[0, 2, 3, -1]] of a 4-node tree:
    [[0, -1, 1, 2]]."""
    m, width = nodes.shape
    out = torch.full((m, num_tree_nodes + 1), -1, dtype=torch.long)  # last column: -1's sink
    rows = torch.arange(width).expand(m, width)
    out.scatter_(1, torch.where(nodes >= 0, nodes, num_tree_nodes), rows)
    return out[:, :num_tree_nodes]
