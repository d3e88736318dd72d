"""The target's middle layers fused into the heads' input (``CloverConfig.target_layers``).

EAGLE-3 feeds its draft layer a low, a middle and a high layer of the target, not only the
last one. Clover reads them the same way, as a correction to H that starts at zero::

    x_t = H_t + sum_j W_j rmsnorm_j(L_j(t))      W_j (D, D), zero at initialisation

where H_t is the target's last hidden state after its final norm and L_j(t) the residual
stream entering its decoder layer j. x then takes H's place everywhere: the Augmenting
Block's input, or h0 itself without a block. With zero W_j, heads warm-started from a
checkpoint that read H alone draft exactly as before until training moves W_j.

The heads receive one **target signal** per token, H then the layers in ``target_layers``
order, concatenated (vLLM's EAGLE-3 concatenates its auxiliary layers the same way).
Example, D = 576 and target_layers [2, 15, 27]::

    signal (T, 2304) = [ H (T, 576) | L_2 (T, 576) | L_15 (T, 576) | L_27 (T, 576) ]
    fuse(signal)     -> x (T, 576)

Checkpoint names (docs/checkpoint-format.md): ``layer_fusion.norms.{a}.weight`` (D,) and
``layer_fusion.projs.{a}.weight`` (D, D), where a is the slot: target layer
``target_layers[a]``.
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
    """Target signal [H | L_a | L_b ...] (..., (1 + A) * D) -> x (..., D), see the module doc."""

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
        # the A norms at once: few rows cost per operator, not per value
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
