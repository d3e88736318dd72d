"""Verifying a tree in one target forward: depth-based positions and the tree mask.

Each node gets the RoPE position of its depth (root + depth) and sees the prefix, the root,
its ancestors and itself, so it is scored as if its own path had been appended alone.
``tree_attention`` is that attention in pure PyTorch, the reference for the CPU path.

How it works: docs/design/drafting.md, "Tree positions and the tree mask".
"""

from __future__ import annotations

import torch

from vllm_clover.tree.spec import TokenTree


def tree_positions(
    tree: TokenTree, root_positions: torch.Tensor, width: int | None = None
) -> torch.Tensor:
    """RoPE positions of the root and the tree's first `width - 1` nodes (all N when None):
    root positions (M,) -> (M, width)."""
    offsets = torch.tensor((0, *tree.depths))[:width]  # the root, then each node's depth
    return root_positions[:, None] + offsets


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree: TokenTree,
    scale: float,
) -> torch.Tensor:
    """One request's attention for its root and nodes over prefix + tree: q (T, nh, hs) with
    T = N + 1 (root, then the nodes); k, v (L + T, nkv, hs), the L prefix entries then the T
    new ones in the same order; nh a multiple of nkv (grouped queries). Returns (T, nh, hs)."""
    t, nh, _ = q.shape
    prefix = k.shape[0] - t
    groups = nh // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).transpose(0, 1)  # (nh, L + T, hs)
    v = v.repeat_interleave(groups, dim=1).transpose(0, 1)  # (nh, L + T, hs)
    visible = torch.cat(
        [torch.ones(t, prefix, dtype=torch.bool), tree.ancestor_mask], dim=1
    )  # (T, L + T)
    dtype = torch.promote_types(q.dtype, torch.float32)  # softmax in at least float32
    scores = torch.einsum("tnh,nsh->nts", q.to(dtype), k.to(dtype)) * scale  # (nh, T, L + T)
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.einsum("nts,nsh->tnh", scores.softmax(dim=-1), v.to(dtype))  # (T, nh, hs)
    return out.to(q.dtype)
