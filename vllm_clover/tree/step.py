"""One engine step that verifies token trees, from input preparation to compaction.

vLLM schedules a tree request like a chain: root and n drafts (the tree's first n nodes) as
n + 1 query rows with slots root + 1 .. root + n. ``TreeStep`` changes what those rows mean in
four places that ``patches/trees.py`` calls: ``set_positions``, ``attend``, ``verify_trees``
(``tree/sampler.py``) and ``compact``.
How it works: docs/design/drafting.md, "One tree step in the runner".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from vllm_clover.tree.accept import TreeVerdict
from vllm_clover.tree.attention import tree_positions
from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan, entry_index
from vllm_clover.tree.kv import compaction_moves
from vllm_clover.tree.spec import TokenTree


@dataclass
class TreeStep:
    """The tree requests of one step: R requests (rows of the input batch) with drafts."""

    tree: TokenTree
    requests: torch.Tensor  # (R,) input-batch rows
    roots: torch.Tensor  # (R,) query row of each root
    num_nodes: torch.Tensor  # (R,) nodes each request drafted: the tree's first, row j node j
    caches: list[torch.Tensor] = field(default_factory=list)  # each layer's kv_cache, in order
    slot_mapping: torch.Tensor | None = None  # the step's (tokens,) KV slots
    plan: TreePlan | None = None  # where every layer reads keys and values, and the mask
    verdict: TreeVerdict | None = None
    moves: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # from settle()

    @classmethod
    def of(cls, tree: TokenTree, num_draft_tokens: list[int], query_start_loc: np.ndarray):
        """From vLLM's per-request draft counts and query starts (num_reqs + 1,), each
        request's drafts a breadth-first prefix of the tree; None when no request has drafts."""
        drafts = np.asarray(num_draft_tokens)
        rows = np.flatnonzero(drafts)
        if rows.size == 0:
            return None
        roots = query_start_loc[rows + 1] - drafts[rows] - 1
        requests, roots = torch.from_numpy(rows), torch.from_numpy(roots.astype(np.int64))
        return cls(tree, requests, roots, torch.from_numpy(drafts[rows]))

    @property
    def width(self) -> int:
        """T: query rows per request in the padded (R, T) views, the root included."""
        return 1 + int(self.num_nodes.max())

    @cached_property
    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """((R, T) query rows of each request's root and nodes, clamped; (R, T) which are real)."""
        offsets = torch.arange(self.width)
        real = offsets[None, :] <= self.num_nodes[:, None]
        rows = self.roots[:, None] + offsets[None, :]
        return torch.where(real, rows, self.roots[:, None]), real

    def set_positions(self, positions: torch.Tensor) -> None:
        """Draft row j of each request (node j) moves from position root + 1 + j to
        root + depth(j)."""
        rows, real = self.rows
        moved = tree_positions(self.tree, positions[self.roots], self.width)  # (R, T)
        positions[rows[real]] = moved[real]

    @cached_property
    def targets(self) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The query rows of every real (request, offset), and where they are in (R, T)."""
        rows, real = self.rows
        return rows[real], real.nonzero(as_tuple=True)

    @cached_property
    def num_rows(self) -> int:
        """Query rows of the step's tree requests: each one's root and nodes."""
        return int(self.num_nodes.sum()) + len(self.num_nodes)

    def covers(self, num_tokens: int) -> bool:
        """Whether the step's tree rows are all of its num_tokens query rows (then vLLM's
        kernel has nothing left to compute)."""
        return self.num_rows == num_tokens

    def attend(self, impl, layer, query, kv_cache, metadata, output) -> None:
        """Compute the tree rows of one layer's attention output, in place. vLLM wrote the
        rows' keys and values into the cache before the attention ran, so the prefix and the
        tree are read from there together."""
        if self.plan is None:  # the same for every layer of the step
            block_size = kv_cache.shape[2]
            self.plan = TreePlan.of(
                self.tree,
                CacheLayout.probe(layer.isa, kv_cache.dtype, block_size, impl.head_size),
                metadata.block_table[self.requests],
                metadata.seq_lens[self.requests].long(),
                self.num_nodes,
            )
            self.slot_mapping = metadata.slot_mapping.clone()
        rows, _ = self.rows
        out = self.plan.attend(query[rows], kv_cache, impl.scale)  # (R, T, nh, hs)
        targets, real = self.targets
        output.index_copy_(0, targets, out[real])
        self.caches.append(kv_cache)

    def settle(self, verdict: TreeVerdict) -> None:
        """Take the sampler's verdict on this step's tree requests, and the (request, source
        offset, target offset) moves it implies, which ``compact`` and ``chain_order`` follow."""
        self.verdict = verdict
        self.moves = compaction_moves(verdict.path)  # node i is draft row i

    def compact(self) -> None:
        """Copy each accepted path's KV entries to the slots of consecutive positions, in
        every layer's cache (all reads of a layer before its writes)."""
        request, source, target = self.moves
        if request.numel() == 0 or not self.caches:
            return
        roots = self.roots[request]
        slots = self.slot_mapping[torch.stack([roots + source, roots + target])].long()
        _, heads, block_size, _ = self.caches[0].shape
        where = entry_index(self.plan.layout, slots, heads, block_size)  # (2, moves, heads, 2, hs)
        for kv_cache in self.caches:
            flat = kv_cache.view(-1)
            flat[where[1]] = flat[where[0]]
        self.caches.clear()

    def chain_order(self, num_rows: int) -> torch.Tensor | None:
        """(num_rows,) the rows to gather so that each accepted path sits right after its
        root, as a chain of that length would have (rows past a path are left as they are:
        like a chain's rejected tokens, nothing reads them), or None when no path moves."""
        request, source, target = self.moves
        if request.numel() == 0:
            return None
        order = torch.arange(num_rows)
        order[self.roots[request] + target] = self.roots[request] + source
        return order


@dataclass
class TreeVerifier:
    """A runner's token tree and the step in flight (None between steps and on steps
    without drafts), with what its verdicts counted. Built by the runner when
    ``speculative_token_tree`` is set."""

    tree: TokenTree
    step: TreeStep | None = None
    verified: int = 0  # requests whose tree was verified
    off_chain: int = 0  # ... whose accepted path left the rank-0 chain (a tree's gain)
    accepted_by_depth: list[int] = field(default_factory=list)  # paths reaching each depth
    accepted_by_node: list[int] = field(default_factory=list)  # times each node was accepted
    drafted_by_node: list[int] = field(default_factory=list)  # times each node was verified

    def record(self, verdict: TreeVerdict, num_nodes: torch.Tensor) -> None:
        """Count a step's verdicts and the nodes (R,) each request drafted (diagnostics and
        tests)."""
        ranks = torch.tensor((0, *self.tree.ranks))[verdict.path + 1]  # (R, depth), -1 -> 0
        self.verified += verdict.path.shape[0]
        self.off_chain += int((ranks > 0).any(dim=-1).sum())
        if not self.accepted_by_depth:
            self.accepted_by_depth = [0] * self.tree.depth
            self.accepted_by_node = [0] * self.tree.num_nodes
            self.drafted_by_node = [0] * self.tree.num_nodes
        reached = (verdict.path >= 0).sum(dim=0).tolist()
        self.accepted_by_depth = _added(self.accepted_by_depth, reached)
        self.accepted_by_node = _added(self.accepted_by_node, _counts(verdict.path, self.tree))
        drafted = torch.arange(self.tree.num_nodes)[None, :] < num_nodes[:, None]
        self.drafted_by_node = _added(self.drafted_by_node, drafted.sum(dim=0).tolist())

    @classmethod
    def of(cls, vllm_config) -> TreeVerifier | None:
        text = getattr(vllm_config.speculative_config, "speculative_token_tree", None)
        return None if text is None else cls(TokenTree.parse(text))


def _counts(path: torch.Tensor, tree: TokenTree) -> list[int]:
    """How often each tree node is on an accepted path (R, depth) (-1 ignored)."""
    return torch.bincount(path[path >= 0], minlength=tree.num_nodes).tolist()


def _added(totals: list[int], counts: list[int]) -> list[int]:
    return [a + b for a, b in zip(totals, counts, strict=True)]
