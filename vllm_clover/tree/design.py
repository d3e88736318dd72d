"""Choosing a tree from measured head accuracy: the N nodes with the highest chance of being
accepted, under the model that each depth's hits are independent.

``rank_accuracy[d][r]`` is the measured chance that head d's rank-r token is the target's
next token, given that the path up to it was right. A node's chance of being accepted is the
product along its path, and the expected number of accepted drafts is the sum over the tree's
nodes; tau is one more (the bonus token). A child never beats its parent, so taking nodes
best-first from the root's children gives the best tree of N nodes (Medusa builds its trees
the same way). Example, rank_accuracy [[0.4, 0.2], [0.3, 0.1]] and 3 nodes::

    (0,) 0.4    (0, 0) 0.12    (1,) 0.2    (0, 1) 0.04    (1, 0) 0.06
    best 3: (0,), (1,), (0, 0): expected accepted 0.72, tau 1.72 (the 2-chain: 1.52)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from vllm_clover.tree.spec import TokenTree


def path_chance(path: tuple[int, ...], rank_accuracy: Sequence[Sequence[float]]) -> float:
    """The chance that every node on ``path`` is accepted (independence model)."""
    return math.prod(rank_accuracy[d][r] for d, r in enumerate(path))


def expected_tau(tree: TokenTree, rank_accuracy: Sequence[Sequence[float]]) -> float:
    """1 + the expected number of accepted nodes per step."""
    return 1.0 + sum(path_chance(p, rank_accuracy) for p in tree.paths)


def best_subtree(tree: TokenTree, chances: Sequence[float], num_nodes: int) -> TokenTree:
    """The ``num_nodes`` nodes of ``tree`` most often accepted, as measured: ``chances[i]``
    is how often node i was accepted when the whole tree was verified (greedy acceptance of
    a node depends on its path only, so the chance holds in any subtree that keeps the
    path). A child is never accepted without its parent, so the best nodes form a tree.
    Example: chances (0.4, 0.2, 0.12) for [(0,), (1,), (0, 0)] and 2 nodes: [(0,), (1,)]."""
    order = sorted(range(tree.num_nodes), key=lambda i: (-chances[i], tree.depths[i], i))
    chosen = set(order[:num_nodes])
    for i in chosen:  # ties at zero may pick a child without its parent: keep parents first
        parent = tree.parents[i]
        if parent >= 0 and parent not in chosen:
            raise ValueError(
                f"node {tree.paths[i]} chosen without its parent: chances not measured on one tree"
            )
    return TokenTree.from_paths([tree.paths[i] for i in sorted(chosen)])


def best_tree(rank_accuracy: Sequence[Sequence[float]], num_nodes: int) -> TokenTree:
    """The ``num_nodes`` nodes of highest acceptance chance (ties: shallower, lower ranks)."""
    if num_nodes < 1:
        raise ValueError(f"a tree needs at least one node, got {num_nodes}")
    frontier = [(-hit, 1, (r,)) for r, hit in enumerate(rank_accuracy[0])]
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < num_nodes:
        negative, _, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < len(rank_accuracy):
            for r, hit in enumerate(rank_accuracy[len(path)]):
                heapq.heappush(frontier, (negative * hit, len(path) + 1, (*path, r)))
    return TokenTree.from_paths(chosen)
