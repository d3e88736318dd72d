"""The Augmenting Block: decoder layer(s) and a norm over the target's hidden states.

Parameter names match vLLM's ``LlamaDecoderLayer``, so the vLLM wrapper loads the same weights.
Training runs causal SDPA over a whole right-padded sequence; no KV cache here.
How it works: docs/design/network.md, "The Augmenting Block: augmenting.py".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.target_layers import layer_weights


class RMSNorm(nn.Module):
    """x / RMS(x) * weight, computed in float32 and cast back (Llama convention)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) * weight over the last axis; weight broadcasts against x (D,) or, for
    several norms applied at once, (A, D) against x (..., A, D)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for neox-style (half-split, Llama) RoPE: positions (B, T) int ->
    cos, sin (B, T, head_dim) float32; columns c and c + head_dim/2 share one frequency."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = theta ** (-exponents / head_dim)  # (hd/2,)
    freqs = positions.float().unsqueeze(-1) * inv_freq  # (B, T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hd)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[c], x[c + hd/2]) by the position angle: x (B, nH, T, hd), cos, sin
    (B, T, hd) -> (B, nH, T, hd) in x's dtype."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half(x)
    out = x.float() * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
    return out.to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_head = config.num_attention_heads
        self.n_kv_head = config.num_key_value_heads
        self.head_dim = hd
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(d, self.n_head * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_head * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv_head * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_head * hd, d, bias=config.attention_bias)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (B, T, D); positions: (B, T)
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(b, t, self.n_head, hd).transpose(1, 2)  # (B, nH, T, hd)
        k = self.k_proj(x).view(b, t, self.n_kv_head, hd).transpose(1, 2)  # (B, nKV, T, hd)
        v = self.v_proj(x).view(b, t, self.n_kv_head, hd).transpose(1, 2)  # (B, nKV, T, hd)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.n_head // self.n_kv_head
        k = k.repeat_interleave(group, dim=1)  # (B, nH, T, hd)
        v = v.repeat_interleave(group, dim=1)  # (B, nH, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nH, T, hd)
        y = y.transpose(1, 2).reshape(b, t, self.n_head * hd)  # (B, T, nH*hd)
        return self.o_proj(y)  # (B, T, D)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        d, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Llama decoder layer: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (B, T, D); positions: (B, T)
        h = x + self.self_attn(self.input_layernorm(x), positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class AugmentingBlock(nn.Module):
    """h0 = norm(layer_L(... layer_1(H))) at every position: the Augmenting Block.

    ``init_from_target`` makes it a copy of the target's last L layers and final norm. State-dict
    names are the checkpoint's: ``layers.{j}.*`` and ``norm.weight``."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        depth = config.num_augmenting_layers
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(depth)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) -> h0 (B, T, D). positions: (T,) or (B, T), default arange(T); only
        RoPE reads them, the mask is causal over the T axis (right padding only)."""
        b, t, _ = x.shape
        pos = normalize_positions(positions, b, t, x.device)  # (B, T)
        for layer in self.layers:
            x = layer(x, pos)
        return self.norm(x)  # (B, T, D)

    @torch.no_grad()
    def init_from_target(
        self,
        layer_states: Mapping[str, torch.Tensor] | Sequence[Mapping[str, torch.Tensor]],
        norm_weight: torch.Tensor,
    ) -> None:
        """Copy the target's last decoder layer(s) and final norm into this block.

        ``layer_states[j]`` initialises ``layers.{j}`` (the last L layers in order, e.g. from
        ``select_last_layers``; one mapping when L == 1); keys may carry any prefix. ValueError
        on a missing key or a shape mismatch; values are cast to the parameter dtype."""
        if isinstance(layer_states, Mapping):
            layer_states = [layer_states]
        if len(layer_states) != len(self.layers):
            raise ValueError(
                f"got {len(layer_states)} target layer states for {len(self.layers)} "
                "augmenting layers"
            )
        for j, (layer, raw) in enumerate(zip(self.layers, layer_states, strict=True)):
            state = layer_weights(raw, self.config)
            for name, param in layer.named_parameters():
                if name not in state:
                    raise ValueError(f"target layer state for layers.{j} is missing '{name}'")
                _copy_checked(param, state[name], f"layers.{j}.{name}")
        _copy_checked(self.norm.weight, norm_weight, "norm.weight")


def normalize_positions(
    positions: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """None -> arange(T); (T,) -> broadcast to (B, T); (B, T) -> as is. Returns (B, T) int64."""
    if positions is None:
        positions = torch.arange(seq, device=device)
    if positions.dim() == 1 and positions.shape[0] == seq:
        positions = positions.unsqueeze(0).expand(batch, seq)
    if positions.shape != (batch, seq):
        raise ValueError(
            f"positions must be (T,) or (B, T) = ({batch}, {seq}), got {tuple(positions.shape)}"
        )
    return positions.long()


def _copy_checked(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(
            f"{name}: target shape {tuple(value.shape)} != expected {tuple(param.shape)}"
        )
    param.copy_(value.to(device=param.device, dtype=param.dtype))
