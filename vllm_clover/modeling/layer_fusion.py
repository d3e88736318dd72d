"""The target's middle layers fused into the heads' input (``CloverConfig.target_layers``).

As EAGLE-3 reads a low, a middle and a high target layer, Clover adds them to H as a
correction that starts at zero: x_t = H_t + sum_j W_j rmsnorm_j(L_j(t)), W_j (D, D) zero at
init, so warm-started heads draft as before until training moves W_j. x takes H's place; the
input is one target signal per token, [H | L_a | L_b ...] in ``target_layers`` order.
How it works: docs/design/network.md, "The target's middle layers: layer_fusion.py".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from vllm_clover.modeling.augmenting import RMSNorm, rms_norm
from vllm_clover.modeling.config import CloverConfig

# Prefix of this module's tensors in a checkpoint.
FUSION_PREFIX = "layer_fusion."


class LayerFusion(nn.Module):
    """Target signal [H | L_a | L_b ...] (..., (1 + A) * D) -> x (..., D), as the module says."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        if not config.target_layers:
            raise ValueError("LayerFusion needs CloverConfig.target_layers")
        d, slots = config.hidden_size, len(config.target_layers)
        self.hidden_size = d
        self.norms = nn.ModuleList(RMSNorm(d, config.rms_norm_eps) for _ in range(slots))
        self.projs = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(slots))
        for proj in self.projs:
            nn.init.zeros_(proj.weight)

    @property
    def signal_width(self) -> int:
        return self.hidden_size * (1 + len(self.projs))

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """This module's tensors under their checkpoint names (``layer_fusion.`` prefix)."""
        return {FUSION_PREFIX + n: t for n, t in self.state_dict().items()}

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        # signal: (..., (1 + A) * D) in any dtype; returns x (..., D) in the fusion's dtype
        if signal.shape[-1] != self.signal_width:
            raise ValueError(
                f"the target signal has width {signal.shape[-1]}; these heads read H and "
                f"{len(self.projs)} target layer(s): {self.signal_width}"
            )
        dtype = self.projs[0].weight.dtype
        d, slots = self.hidden_size, len(self.projs)
        hidden = signal[..., :d].to(dtype)  # (..., D) H
        layers = signal[..., d:].unflatten(-1, (slots, d)).to(dtype)  # (..., A, D) L_j
        # the A norms at once: with few rows the cost is per operator, not per value
        weights = torch.stack([norm.weight for norm in self.norms])  # (A, D)
        normed = rms_norm(layers, weights, self.norms[0].eps)  # (..., A, D)
        fused = sum(proj(n) for proj, n in zip(self.projs, normed.unbind(-2), strict=True))
        return hidden + fused  # (..., D)


def signal_columns(
    have: Sequence[int], want: Sequence[int], hidden_size: int
) -> torch.Tensor | None:
    """Columns of a signal that carries layers ``have`` forming the signal of layers ``want``
    (a subset), or None when the two are the same. H's columns always come first.

    Example, D = 4, have [2, 15, 27], want [15]: columns [0, 1, 2, 3, 8, 9, 10, 11].
    """
    if list(have) == list(want):
        return None
    missing = sorted(set(want) - set(have))
    if missing:
        raise ValueError(f"the target signal carries layers {list(have)}, not {missing}")
    slots = [0] + [1 + list(have).index(j) for j in want]
    return torch.cat([torch.arange(s * hidden_size, (s + 1) * hidden_size) for s in slots])
