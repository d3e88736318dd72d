"""A token tree as users give it: paths of top-k ranks, one rank per depth.

``"[(0,), (1,), (0, 0)]"`` is three draft nodes under a root (the token the target just
produced): head 0's best and second-best tokens, then head 1's best after the first. This is
the format vLLM and Medusa took (``speculative_token_tree``). Nodes are numbered breadth-first.

How it works: docs/design/drafting.md, "Token trees: the format".
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

import torch

ROOT = -1  # parent index of the depth-1 nodes


class TokenTreeError(ValueError):
    """A malformed tree, naming the path at fault."""


@dataclass(frozen=True)
class TokenTree:
    """A validated tree of draft nodes, breadth-first (parents before their children)."""

    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def parse(cls, tree: str | list | tuple) -> TokenTree:
        """From ``"[(0,), (1,), (0, 0)]"`` or the same as a list of tuples (or lists)."""
        if isinstance(tree, str):
            try:
                tree = ast.literal_eval(tree)
            except (ValueError, SyntaxError) as error:
                raise TokenTreeError(
                    f"speculative_token_tree {tree!r} is not a Python literal list of tuples, "
                    f'like "[(0,), (1,), (0, 0)]": {error}'
                ) from None
        if not isinstance(tree, (list, tuple)) or not tree:
            raise TokenTreeError(
                f"speculative_token_tree must be a non-empty list of paths, got {tree!r}"
            )
        paths = [_as_path(path) for path in tree]
        return cls.from_paths(paths)

    @classmethod
    def chain(cls, length: int) -> TokenTree:
        """The chain of ``length`` top-1 nodes: [(0,), (0, 0), ...]."""
        return cls.from_paths([(0,) * d for d in range(1, length + 1)])

    @classmethod
    def from_paths(cls, paths: list[tuple[int, ...]]) -> TokenTree:
        seen = set()
        for path in paths:
            if path in seen:
                raise TokenTreeError(f"path {path} appears twice in speculative_token_tree")
            seen.add(path)
        for path in paths:
            if len(path) > 1 and path[:-1] not in seen:
                raise TokenTreeError(
                    f"path {path} has no parent: {path[:-1]} is not in speculative_token_tree"
                )
        return cls(tuple(sorted(paths, key=lambda p: (len(p), p))))

    def check_fits(self, num_heads: int, draft_vocab_size: int) -> None:
        """TokenTreeError unless every depth has a trained head and every rank a token."""
        if self.depth > num_heads:
            deep = next(p for p in self.paths if len(p) > num_heads)
            raise TokenTreeError(
                f"path {deep} is {len(deep)} deep but the Clover heads have {num_heads} "
                f"trained heads (one per depth)"
            )
        wide = [p for p in self.paths if max(p) >= draft_vocab_size]
        if wide:
            raise TokenTreeError(
                f"path {wide[0]} asks for rank {max(wide[0])} but the heads draft from "
                f"{draft_vocab_size} tokens"
            )

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.paths[-1])

    @property
    def is_chain(self) -> bool:
        return all(p == (0,) * len(p) for p in self.paths)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """Index of each node's parent, ROOT for depth 1."""
        index = {path: i for i, path in enumerate(self.paths)}
        return tuple(index[p[:-1]] if len(p) > 1 else ROOT for p in self.paths)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.paths)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        return tuple(p[-1] for p in self.paths)

    def level(self, depth: int) -> slice:
        """The nodes at ``depth`` (1-based), a slice of node indices (breadth-first)."""
        first = self.depths.index(depth)
        return slice(first, first + self.depths.count(depth))

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` (ROOT for the root's) in rank order."""
        kids = [i for i, p in enumerate(self.parents) if p == node]
        return tuple(sorted(kids, key=lambda i: self.ranks[i]))

    def ancestors(self, node: int) -> tuple[int, ...]:
        """Nodes from depth 1 down to ``node`` itself: the path a verified prefix takes."""
        chain = []
        while node != ROOT:
            chain.append(node)
            node = self.parents[node]
        return tuple(reversed(chain))

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """(N + 1, N + 1) bool, row q sees column k: the root (row 0) and the nodes (1 + i).

        Each node sees the root, its ancestors and itself (example: docs/design/drafting.md).
        """
        n = self.num_nodes
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[0, 1:] = False
        for i in range(n):
            for a in self.ancestors(i):
                mask[1 + i, 1 + a] = True
        return mask

    def __str__(self) -> str:
        return "[" + ", ".join(str(p) for p in self.paths) + "]"


def _as_path(path: object) -> tuple[int, ...]:
    if not isinstance(path, (list, tuple)) or not path:
        raise TokenTreeError(f"each path must be a non-empty tuple of ranks, got {path!r}")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
        raise TokenTreeError(f"path {path!r}: ranks must be integers >= 0")
    return tuple(path)
