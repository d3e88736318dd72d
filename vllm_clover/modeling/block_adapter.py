"""What surrounds the Augmenting Block: the next-token fusion before it, the gate after it.

Both optional and position-wise, shared by training and serving: ``fuse_next_token`` (Clover-2)
fuses H_t with emb(x_{t+1}) by one attention-decoder step before the block, as EAGLE feeds
(H_t, x_{t+1}) to its layer; ``augmenting_gate`` makes h0 = x + g * (y - x), g = 0 at init.
How it works: docs/design/network.md, "Around the block: block_adapter.py".
"""

from __future__ import annotations

import torch
import torch.nn as nn

from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.head_loop import AttentionDecoder
from vllm_clover.modeling.tables import TargetTables

# Checkpoint names this module owns (prefixes and whole names).
ADAPTER_PREFIXES = ("fuse.",)
ADAPTER_NAMES = ("gate",)


class BlockAdapter(nn.Module):
    """The Augmenting Block's input (H, or H fused with the next token) and its gated output."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.fuse = (
            AttentionDecoder(d, config.decoder_num_heads, config.rms_norm_eps)
            if config.fuse_next_token
            else None
        )
        self.gate = nn.Parameter(torch.zeros(d)) if config.augmenting_gate else None

    def block_input(
        self, hidden: torch.Tensor, next_ids: torch.Tensor, tables: TargetTables
    ) -> torch.Tensor:
        """x: H (..., D) as is, or fused with the embedding of next_ids (...,)."""
        if self.fuse is None:
            return hidden
        return self.fuse(hidden, tables.embed(next_ids, hidden.dtype))  # (..., D)

    def block_output(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """h0 from the block's input x and output y, both (..., D)."""
        if self.gate is None:
            return y
        return x + self.gate.to(y.dtype) * (y - x)
