"""Teacher forcing: which token feeds which Clover head, and which token it must predict."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class HeadTokens(NamedTuple):
    """Teacher-forcing tokens from ``shift_tokens_for_heads``; all (B, T, K)."""

    input_ids: torch.Tensor  # regressive input of head i at position t: x_{t+1+i}
    target_ids: torch.Tensor  # label of head i at position t: x_{t+2+i}
    mask: torch.Tensor  # bool, False where x_{t+2+i} is past the end / padding


def shift_tokens_for_heads(
    input_ids: torch.Tensor,
    num_heads: int,
    attention_mask: torch.Tensor | None = None,
    pad_id: int = 0,
) -> HeadTokens:
    """Which token feeds which head and which token each head must predict.

    input_ids: (B, T) right-padded; attention_mask: (B, T) 1/True for real tokens. Head i at t
    reads x_{t+1+i} and predicts x_{t+2+i}; out-of-range entries are ``pad_id``, mask False.
    Returns HeadTokens, each (B, T, K). Worked example: docs/design/network.md."""
    device = input_ids.device
    rows = torch.arange(input_ids.shape[1], device=device).unsqueeze(1)  # (T, 1)
    steps = rows + torch.arange(num_heads, device=device)  # (T, K): t + i
    in_idx, tgt_idx = steps + 1, steps + 2  # (T, K) positions of x_{t+1+i}, x_{t+2+i}
    padded = F.pad(input_ids, (0, num_heads + 1), value=pad_id)  # (B, T+K+1)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    valid = F.pad(attention_mask.bool(), (0, num_heads + 1), value=False)  # (B, T+K+1)
    return HeadTokens(padded[:, in_idx], padded[:, tgt_idx], valid[:, tgt_idx])
