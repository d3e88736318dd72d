"""Tree attention over vLLM-CPU's paged KV cache, for the speculative part of a step.

vLLM's CPU kernel knows causal masks only, so each tree request's rows (root and nodes) are
computed here in PyTorch with the tree mask, from keys and values in the paged cache, whose
per-ISA layout ``CacheLayout.probe`` learns with vLLM's own writer instead of encoding it.

How it works: docs/design/drafting.md, "Tree attention on vLLM-CPU's paged cache".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from vllm import _custom_ops as ops

from vllm_clover.tree.kv import slots
from vllm_clover.tree.spec import TokenTree


@dataclass(frozen=True)
class StridedHalf:
    """A block's key (or value) half as a strided view: token j = (j1, j0) and channel
    d = (d1, d0) in digits of sizes (block_size / q, q, head_size / p, p) sit at offset
    ``origin + j1 * strides[0] + j0 * strides[1] + d1 * strides[2] + d0 * strides[3]``
    (examples per ISA: docs/design/drafting.md)."""

    sizes: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    origin: int

    @classmethod
    def find(cls, index: torch.Tensor) -> StridedHalf | None:
        """The view that reads ``index`` (block_size, head_size) in (j, d) order, if any."""
        block_size, head_size = index.shape
        offsets = torch.arange(index.numel())
        for q in _powers_of_two(block_size):
            for p in _powers_of_two(head_size):
                sizes = (block_size // q, q, head_size // p, p)
                digits = index.view(sizes)
                origin = int(digits[0, 0, 0, 0])
                unit = [(0,) * i + (min(1, n - 1),) + (0,) * (3 - i) for i, n in enumerate(sizes)]
                strides = tuple(int(digits[u]) - origin for u in unit)
                end = origin + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True))
                if min(strides) < 0 or end >= index.numel():
                    continue
                if torch.equal(offsets.as_strided(sizes, strides, origin), digits):
                    return cls(sizes, strides, origin)
        return None


def _powers_of_two(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if n % (1 << i) == 0]


@dataclass(frozen=True)
class CacheLayout:
    """Where token j's channel d of a (block, KV head) lives, for keys and for values:
    ``key[j, d]`` is offset ``key_index[j, d]`` of the block's flattened key half
    (block_size * head_size values), likewise for values; and the same as strided views,
    where the layout is one."""

    key_index: torch.Tensor  # (block_size, head_size) int64
    value_index: torch.Tensor  # (block_size, head_size) int64
    key_view: StridedHalf | None = None
    value_view: StridedHalf | None = None

    @staticmethod
    @lru_cache(maxsize=8)
    def probe(isa: str, dtype: torch.dtype, block_size: int, head_size: int) -> CacheLayout:
        """Learn the layout by writing codes j * head_size + d with vLLM's writer. Codes are
        written in base-256 digits, which every float cache dtype holds exactly."""
        codes = torch.arange(block_size * head_size).view(block_size, 1, head_size)
        found = [torch.zeros(block_size * head_size, dtype=torch.long) for _ in range(2)]
        for digit in range(2 if block_size * head_size > 256 else 1):
            part = (codes // 256**digit % 256).to(dtype)  # (block_size, 1, head_size)
            cache = torch.zeros(1, 1, 2 * block_size, head_size, dtype=dtype)
            key_cache, value_cache = cache.chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(
                part, part, key_cache, value_cache, torch.arange(block_size), isa,
                k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto",
            )  # fmt: skip
            for slot, half in zip(found, (key_cache, value_cache), strict=True):
                slot += half.reshape(-1).long() * 256**digit
        inverse = []
        for flat in found:  # flat[offset] = code -> index[code] = offset
            index = torch.empty_like(flat)
            index[flat] = torch.arange(flat.numel())
            inverse.append(index.view(block_size, head_size))
        return CacheLayout(*inverse, *map(StridedHalf.find, inverse))


def entry_index(layout: CacheLayout, slots: torch.Tensor, heads: int, block_size: int):
    """Where each slot's key and value live in a layer's flattened cache: slots (...,) ->
    (..., KV heads, 2, head_size) offsets into ``kv_cache.view(-1)`` (kv_cache (blocks, KV
    heads, block_size, 2 * head_size), each (block, head) region its keys' half then its
    values' half, each in ``layout``)."""
    head_size = layout.key_index.shape[1]
    half = block_size * head_size
    block, j = slots // block_size, slots % block_size
    region = (block[..., None] * heads + torch.arange(heads)) * 2 * half  # (..., heads)
    within = torch.stack([layout.key_index[j], half + layout.value_index[j]], dim=-2)
    return region[..., None, None] + within[..., None, :, :]  # (..., heads, 2, head_size)


@dataclass(frozen=True)
class TreePlan:
    """What every layer of a step reads the same way: the cache blocks of each tree request
    (its prefix and its tree rows, which vLLM wrote before the attention ran), and which of
    their S = blocks * block_size columns each tree row sees."""

    layout: CacheLayout
    blocks: torch.Tensor  # (R, nb) cache blocks of each request, padded with its first
    mask: torch.Tensor  # (R, 1, T, S) float32, 0 where a row sees a column, -inf elsewhere

    @classmethod
    def of(
        cls,
        tree: TokenTree,
        layout: CacheLayout,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        num_nodes: torch.Tensor,
    ) -> TreePlan:
        """block_table (R, max blocks); seq_lens (R,) tokens including the root and nodes;
        num_nodes (R,) the nodes each request drafted (the tree's first, breadth-first).
        Columns past a request's length are padding (example: docs/design/drafting.md)."""
        block_size = layout.key_index.shape[0]
        nb = -(-int(seq_lens.max()) // block_size)
        blocks = block_table[:, :nb].long()
        used = torch.arange(nb)[None, :] * block_size < seq_lens[:, None]
        blocks = torch.where(used, blocks, blocks[:, :1])
        position = torch.arange(nb * block_size)
        prefix = seq_lens - 1 - num_nodes  # (R,)
        sees = position[None, None, :] < prefix[:, None, None]  # (R, 1, S) -> (R, T, S)
        sees = sees.expand(-1, 1 + int(num_nodes.max()), -1).clone()
        for r in range(len(seq_lens)):
            n = 1 + int(num_nodes[r])  # the root, then the request's nodes
            sees[r, :n, prefix[r] : prefix[r] + n] = tree.ancestor_mask[:n, :n]
        mask = torch.zeros(sees.shape).masked_fill_(~sees, float("-inf"))
        return cls(layout, blocks, mask[:, None])

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, scale: float) -> torch.Tensor:
        """One layer's attention of the tree rows: q (R, T, nh, hs) -> (R, T, nh, hs), from
        keys and values put in order first (``gather``, ``tree_attention_rows``)."""
        return tree_attention_rows(self, q, *self.gather(kv_cache), scale)

    def gather(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (R, KV heads, S, head_size) of one layer's cache: the requests'
        blocks in one copy, then each half put in order by one copy through its strided
        view (for a layout that is not strided, a gather of every entry)."""
        (r, nb), (_, heads, block_size, width) = self.blocks.shape, kv_cache.shape
        head_size = width // 2
        shape = (r, heads, nb * block_size, head_size)
        if self.layout.key_view is None or self.layout.value_view is None:
            positions = torch.arange(nb * block_size).expand(r, -1)
            index = entry_index(self.layout, slots(self.blocks, positions, block_size), heads,
                                block_size).permute(0, 2, 1, 3, 4)  # fmt: skip
            entries = kv_cache.view(-1)[index]  # (R, heads, S, 2, hs)
            return entries[..., 0, :], entries[..., 1, :]
        region = 2 * block_size * head_size  # one (block, head): keys, then values
        copied = kv_cache.index_select(0, self.blocks.view(-1))  # (R * nb, heads, bs, 2 hs)
        halves = []
        for view, start in ((self.layout.key_view, 0), (self.layout.value_view, region // 2)):
            source = copied.as_strided(
                (r, heads, nb, *view.sizes),
                (nb * heads * region, region, heads * region, *view.strides),
                start + view.origin,
            )  # (R, heads, nb, j1, j0, d1, d0)
            halves.append(source.contiguous().view(shape))
        return halves[0], halves[1]


def tree_attention_rows(
    plan: TreePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of R tree requests' root and nodes, batched: q (R, T, nh, hs) with T = 1 +
    the most nodes scheduled; k, v (R, nkv, S, hs) from ``TreePlan.gather``. Returns
    (R, T, nh, hs); rows past a request's nodes are left as computed (the caller ignores
    them)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).to(dtype), k.to(dtype), v.to(dtype),
        attn_mask=plan.mask, scale=scale, enable_gqa=True,
    )  # fmt: skip
    return out.transpose(1, 2).to(q.dtype)  # (R, T, nh, hs)
