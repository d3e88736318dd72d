"""The EAGLE-3 drafter in pure PyTorch, as vLLM's ``llama_eagle3.py`` computes it, with the
training-time test (TTT) unrolled over a whole sequence at once.

Step k at position t reads embed(x_{t+1}) and g (step 0: the fused target layers; later: the
previous step's output at t), and guesses x_{t+2+k}; it attends to step 0's keys at positions
<= t and to steps 1..k's at t only, as at inference. How it works, with an example:
docs/design/network.md, "The EAGLE-3 drafter: eagle3/network.py".
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.eagle3.config import Eagle3Config


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE in the rotate-half (neox) layout vLLM uses for Llama: x (B, T, h, d),
    positions (T,) or (B, T)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = positions.float()[..., None] * inv  # (..., T, d / 2)
    cos = torch.cat([angles.cos()] * 2, dim=-1).unsqueeze(-2)  # (..., T, 1, d)
    sin = torch.cat([angles.sin()] * 2, dim=-1).unsqueeze(-2)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return (x.float() * cos + half.float() * sin).to(x.dtype)


class Eagle3Drafter(nn.Module):
    """The drafter's trained weights (names as the speculators format saves them) and the
    target's frozen input embedding; ``d2t`` maps draft row i to target id i + d2t[i]."""

    def __init__(self, config: Eagle3Config, embed: torch.Tensor, draft_ids: torch.Tensor):
        super().__init__()
        c, d = config, config.hidden_size
        self.config = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.fc = nn.Linear(len(c.aux_layers) * d, d, bias=False)
        self.input_layernorm = nn.RMSNorm(d, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(d, eps=c.rms_norm_eps)
        self.q_proj = nn.Linear(2 * d, q, bias=False)
        self.k_proj = nn.Linear(2 * d, kv, bias=False)
        self.v_proj = nn.Linear(2 * d, kv, bias=False)
        self.o_proj = nn.Linear(q, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=c.rms_norm_eps)
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)
        self.norm = nn.RMSNorm(d, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(d, c.draft_vocab_size, bias=False)
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)
        self.register_buffer("draft_ids", draft_ids.long().clone(), persistent=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """g at step 0: (..., A * D) the target layers' inputs -> (..., D)."""
        return self.fc(aux)

    def layer_input(self, tokens: torch.Tensor, g: torch.Tensor):
        """x (..., 2D) and the residual (..., D) of the tokens after each position."""
        e = F.embedding(tokens, self.embed)  # norms in float32, as vLLM's RMSNorm computes
        x = torch.cat([self.input_layernorm(e.float()), self.hidden_norm(g.float())], dim=-1)
        return x.to(g.dtype), g

    def after_attention(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """s, the pre-norm output: (..., heads * d) attention values -> (..., D)."""
        r = residual + self.o_proj(attended)
        y = self.post_attention_layernorm(r.float())
        return r + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(s.float()))  # (..., N)

    def unrolled(self, aux: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor):
        """The TTT steps over whole sequences: aux (B, T, A * D), input_ids and mask (B, T)
        -> [s (B, T, D)] per step, the pre-norm outputs; ``logits(s)`` of step k at t guess
        x_{t+2+k}."""
        c = self.config
        g = self.fuse(aux.to(self.fc.weight.dtype))
        t = input_ids.shape[1]
        positions = torch.arange(t, device=aux.device)
        causal = torch.ones(t, t, dtype=torch.bool, device=aux.device).tril()
        own_row = torch.eye(t, dtype=torch.bool, device=aux.device)  # never a row of -inf only
        allowed = causal & (mask[:, None, None, :].bool() | own_row)  # (B, 1, T, T)
        group = c.num_attention_heads // c.num_key_value_heads
        keys, values, out = [], [], []  # each step's, repeated to the query heads once
        for k in range(c.ttt_steps):
            tokens = F.pad(input_ids[:, 1 + k :], (0, 1 + k))  # x_{t+1+k}, 0 past the end
            x, residual = self.layer_input(tokens, g)
            q = self.heads(self.q_proj(x), positions + k)
            key = self.heads(self.k_proj(x), positions + k)
            keys.append(key.repeat_interleave(group, dim=2))
            values.append(self.heads(self.v_proj(x)).repeat_interleave(group, dim=2))
            g = self.after_attention(self.attend(q, keys, values, allowed).flatten(-2), residual)
            out.append(g)
        return out

    def heads(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, n * d) -> (B, T, n, d), rotated to ``positions`` when given."""
        x = x.unflatten(-1, (-1, self.config.head_dim))
        return x if positions is None else rotate(x, positions, self.config.rope_theta)

    def attend(self, q, keys, values, allowed: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, d) over step 0's keys at the positions ``allowed`` (B, 1, T, T) and
        the later steps' keys at t; keys and values (B, T, H, d) each: (B, T, H, d)."""
        t, scale = q.shape[1], self.config.head_dim**-0.5
        scores = torch.einsum("bthd,bshd->bhts", q, keys[0]).float() * scale  # (B, H, T, T)
        scores = scores.masked_fill(~allowed, float("-inf"))
        own = [
            (q * kj).sum(-1).float().transpose(1, 2) * scale for kj in keys[1:]
        ]  # each (B, H, T): step j's key at t
        p = torch.cat([scores, *[s[..., None] for s in own]], dim=-1).softmax(dim=-1)
        out = torch.einsum("bhts,bshd->bthd", p[..., :t].to(values[0].dtype), values[0])
        for j, vj in enumerate(values[1:]):
            out = out + p[..., t + j].transpose(1, 2)[..., None].to(vj.dtype) * vj  # (B,T,H,d)
        return out
