"""Tree attention over vLLM-CPU's paged KV cache, for the speculative part of a step.

vLLM's CPU kernel (`cpu_attention_with_kv_cache`) knows causal masks only. On a tree step the
runner lets it compute every row as usual, and then recomputes the rows of each tree request
(its root and nodes) here, in PyTorch: the prefix's keys and values are read from the paged
cache, the tree's own from the layer's fresh key/value rows, and the mask is the tree's
(``TokenTree.ancestor_mask``). A GPU build would instead hand the same mask to a kernel that
takes a custom mask (FlashInfer's, or FlexAttention's block mask) and never recompute.

The kernel stores each (block, KV head) in a layout of its own per ISA (keys transposed for
`vec`, paired for `amx`, ...). Rather than encode those layouts, ``CacheLayout.probe`` writes
known values with vLLM's own writer (`cpu_attn_reshape_and_cache`) into a one-block cache and
reads back where each (token, channel) landed; reading the prefix is then a gather.
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
class CacheLayout:
    """Where token j's channel d of a (block, KV head) lives, for keys and for values:
    ``key[j, d]`` is offset ``key_index[j, d]`` of the block's flattened key half
    (block_size * head_size values), likewise for values."""

    key_index: torch.Tensor  # (block_size, head_size) int64
    value_index: torch.Tensor  # (block_size, head_size) int64

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
        return CacheLayout(*inverse)


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
    """What every layer of a step reads the same way: where each tree request's keys and
    values lie in the paged cache (its prefix and its tree rows, which vLLM wrote before the
    attention ran), and which of them each tree row sees."""

    index: torch.Tensor  # (R, KV heads, S, 2, head_size) offsets into kv_cache.view(-1)
    mask: torch.Tensor  # (R, 1, T, S) bool

    @classmethod
    def of(
        cls,
        tree: TokenTree,
        layout: CacheLayout,
        block_table: torch.Tensor,
        shape: tuple[int, int],
        seq_lens: torch.Tensor,
        num_nodes: torch.Tensor,
    ) -> TreePlan:
        """block_table (R, max blocks); shape (KV heads, block_size); seq_lens (R,) tokens
        including the root and nodes; num_nodes (R,) nodes scheduled (a breadth-first prefix
        of the tree). Example, seq_lens (10, 7), 3 and 1 nodes of a 3-node tree: S = 10; the
        first request's tree rows see columns 0..5 and their tree part at 6..9, the second's
        0..4 and 5..6, columns 7..9 being padding."""
        heads, block_size = shape
        s, t = int(seq_lens.max()), 1 + int(num_nodes.max())
        position = torch.arange(s)
        where = slots(block_table.long(), position.expand(len(seq_lens), -1), block_size)
        index = entry_index(layout, where, heads, block_size)  # (R, S, heads, 2, hs)
        prefix = seq_lens - 1 - num_nodes  # (R,)
        mask = position[None, None, :] < prefix[:, None, None]  # (R, 1, S) -> (R, T, S)
        mask = mask.expand(-1, t, -1).clone()
        ancestors = tree.ancestor_mask
        for r in range(len(seq_lens)):
            n = 1 + int(num_nodes[r])
            mask[r, :n, prefix[r] : prefix[r] + n] = ancestors[:n, :n]
        return cls(index.permute(0, 2, 1, 3, 4), mask[:, None])

    def gather(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (R, KV heads, S, head_size) of one layer's cache."""
        entries = kv_cache.view(-1)[self.index]  # (R, heads, S, 2, hs)
        return entries[..., 0, :], entries[..., 1, :]


def tree_attention_rows(
    plan: TreePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of R tree requests' root and nodes, batched: q (R, T, nh, hs) with T = 1 +
    the most nodes scheduled; k, v (R, nkv, S, hs) from ``TreePlan.gather``. Returns
    (R, T, nh, hs); rows past a request's nodes are left as computed (the caller ignores
    them)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).to(dtype),
        k.to(dtype),
        v.to(dtype),
        attn_mask=plan.mask,
        scale=scale,
        enable_gqa=True,
    )  # (R, nh, T, hs)
    return out.transpose(1, 2).to(q.dtype)  # (R, T, nh, hs)
