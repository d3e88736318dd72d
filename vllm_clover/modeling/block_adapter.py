"""What surrounds the Augmenting Block: the next-token fusion before it, the gate after it.

The block itself is decoder layers over a sequence (``AugmentingBlock`` in training, vLLM's
paged layers in serving); this module owns the two optional, position-wise pieces around
it, shared by both::

    x  = H_t                                   (the paper's Clover)
    x  = H_t + cos(q, k) * v,  k, v from emb(x_{t+1})
                                               fuse_next_token (Clover-2): one attention-
                                               decoder step reads the next token before the
                                               block, as EAGLE feeds (H_t, x_{t+1}) to its layer
    y  = block(x)
    h0 = y                                     (no gate)
    h0 = x + g * (y - x),  g (D,) = 0 at init  augmenting_gate: training starts from h0 = x

Worked example of the token each position reads, prompt x0 x1 x2 and t0 = x3 just sampled::

    position t       0    1    2
    H_t              H0   H1   H2
    next token       x1   x2   x3 (= t0)

In vLLM these are EAGLE's shifted ``input_ids``, which the draft model's forward receives.

Checkpoint names (docs/checkpoint-format.md): ``fuse.{norm,q_proj,k_proj,v_proj}.weight``
and ``gate``.
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
