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


@dataclass(frozen=True)
class PrefixPlan:
    """What every layer of a step reads the same way: where each request's prefix lies in
    the paged cache, and the (prefix + tree) mask of its tree rows."""

    blocks: torch.Tensor  # (R, P) cache block of each prefix position
    key_offsets: torch.Tensor  # (P, head_size) offsets in a block's key half
    value_offsets: torch.Tensor  # (P, head_size) ... and in its value half
    mask: torch.Tensor  # (R, 1, T, P + T) bool: which key each tree row sees

    @classmethod
    def of(
        cls,
        tree: TokenTree,
        layout: CacheLayout,
        block_table: torch.Tensor,
        block_size: int,
        prefix_lengths: torch.Tensor,
        num_nodes: torch.Tensor,
    ) -> PrefixPlan:
        """block_table (R, max blocks); prefix_lengths (R,) cached tokens before each root;
        num_nodes (R,) nodes scheduled (a breadth-first prefix of the tree)."""
        longest = int(prefix_lengths.max())
        position = torch.arange(longest)
        t = 1 + int(num_nodes.max())
        in_prefix = position[None, :] < prefix_lengths[:, None]  # (R, P)
        scheduled = torch.arange(t)[None, :] <= num_nodes[:, None]  # (R, T): root + nodes
        in_tree = tree.ancestor_mask[None, :t, :t] & scheduled[:, None, :]  # (R, T, T)
        visible = torch.cat([in_prefix[:, None, :].expand(-1, t, -1), in_tree], dim=2)
        return cls(
            block_table[:, position // block_size].long(),
            layout.key_index[position % block_size],
            layout.value_index[position % block_size],
            visible[:, None],
        )


def gather_prefix(half: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Each request's prefix entries from one half (keys or values) of a layer's cache:
    half (cache blocks, KV heads, block_size, head_size) in the kernel's layout, blocks
    (R, P) and offsets (P, head_size) from ``PrefixPlan`` -> (R, KV heads, P, head_size)."""
    num_blocks, heads, block_size, head_size = half.shape
    flat = half.reshape(num_blocks, heads, block_size * head_size)  # a view: blocks are contiguous
    return flat[
        blocks[:, None, :, None],
        torch.arange(heads)[None, :, None, None],
        offsets[None, None, :, :],
    ]  # (R, KV heads, P, head_size)


def tree_attention_rows(
    plan: PrefixPlan,
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of R tree requests' root and nodes, batched.

    q (R, T, nh, hs) with T = 1 + the most nodes scheduled; k_new, v_new (R, T, nkv, hs)
    the same rows' keys and values; k_prefix, v_prefix (R, nkv, P, hs) each request's cached
    prefix (``gather_prefix``). Returns (R, T, nh, hs); rows past a request's nodes are left
    as computed (the caller ignores them).
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    k = torch.cat([k_prefix, k_new.transpose(1, 2)], dim=2).to(dtype)  # (R, nkv, P+T, hs)
    v = torch.cat([v_prefix, v_new.transpose(1, 2)], dim=2).to(dtype)  # (R, nkv, P+T, hs)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).to(dtype), k, v, attn_mask=plan.mask, scale=scale, enable_gqa=True
    )  # (R, nh, T, hs)
    return out.transpose(1, 2).to(q.dtype)  # (R, T, nh, hs)
