"""The EAGLE-3 drafter's unrolled training-time test against drafting one token at a time,
the way vLLM runs it: step 0 over the context, then each draft reading the context's keys and
the drafts' own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import randomize
from vllm_clover.eagle3.config import Eagle3Config
from vllm_clover.eagle3.network import Eagle3Drafter, rotate

pytestmark = pytest.mark.unit

D, V, A = 32, 50, 3


def drafter(steps: int = 3) -> Eagle3Drafter:
    config = Eagle3Config(
        hidden_size=D,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=1e3,
        max_position_embeddings=128,
        vocab_size=V,
        draft_vocab_size=20,
        aux_layers=(1, 2, 3),
        ttt_steps=steps,
    )
    torch.manual_seed(0)
    model = Eagle3Drafter(config, torch.randn(V, D), torch.arange(0, 40, 2))
    randomize(model, 1)
    return model


def attention(model: Eagle3Drafter, x: torch.Tensor, keys, values, position: int):
    """One query row x (2D,) at ``position`` over explicit key/value rows (kv heads, d)."""
    c = model.config
    q = rotate(model.heads(model.q_proj(x)), torch.tensor([position]), c.rope_theta)  # (1, H, d)
    group = c.num_attention_heads // c.num_key_value_heads
    k = torch.stack(keys).repeat_interleave(group, dim=1).transpose(0, 1)  # (H, S, d)
    v = torch.stack(values).repeat_interleave(group, dim=1).transpose(0, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v)  # (H, 1, d)
    return out.transpose(0, 1).flatten(-2)[0]  # (H * d,)


def drafted_one_by_one(model: Eagle3Drafter, aux, ids, t: int) -> list[torch.Tensor]:
    """s of steps 0..K-1 at position t: step 0 over positions 0..t with their own keys, then
    draft k at position t + k reading the context's keys and drafts 1..k's."""
    c = model.config
    x0, res0 = model.layer_input(F.pad(ids[0, 1:], (0, 1)), model.fuse(aux[0]))  # (T, 2D)
    k0 = rotate(model.heads(model.k_proj(x0)), torch.arange(len(x0)), c.rope_theta)
    keys, values = list(k0[: t + 1]), list(model.heads(model.v_proj(x0))[: t + 1])
    s = model.after_attention(attention(model, x0[t], keys, values, t), res0[t])
    states = [s]
    for k in range(1, c.ttt_steps):
        x, res = model.layer_input(ids[0, t + 1 + k], s)
        key = rotate(model.heads(model.k_proj(x)), torch.tensor([t + k]), c.rope_theta)
        keys.append(key[0])
        values.append(model.heads(model.v_proj(x)))
        s = model.after_attention(attention(model, x, keys, values, t + k), res)
        states.append(s)
    return states


@torch.no_grad()
def test_unrolled_steps_equal_drafting_one_token_at_a_time() -> None:
    """Every TTT step at every position t (with room for its tokens) is what drafting after
    position t computes, through the context keys and the drafts' own; padding after a
    shorter sequence changes nothing."""
    model = drafter()
    gen = torch.Generator().manual_seed(2)
    t_len = 9
    aux = torch.randn(1, t_len, A * D, generator=gen)
    ids = torch.randint(0, V, (1, t_len), generator=gen)
    unrolled = model.unrolled(aux, ids, torch.ones(1, t_len, dtype=torch.bool))
    for t in range(t_len - model.config.ttt_steps - 1):
        reference = drafted_one_by_one(model, aux, ids, t)
        for k in range(model.config.ttt_steps):
            torch.testing.assert_close(unrolled[k][0, t], reference[k], rtol=1e-4, atol=1e-5)
    padded = model.unrolled(
        F.pad(aux, (0, 0, 0, 3)), F.pad(ids, (0, 3)), torch.arange(t_len + 3)[None] < t_len
    )
    for k in range(model.config.ttt_steps):
        torch.testing.assert_close(padded[k][:, :t_len], unrolled[k], rtol=1e-4, atol=1e-5)


def test_rotation_is_relative() -> None:
    """RoPE: a query and key moved by the same offset score the same (the drafter trains at
    positions 0.., vLLM runs it at the target's)."""
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 1, 1, 8, generator=gen).unbind(0)
    near = (rotate(q, torch.tensor([5]), 1e3) * rotate(k, torch.tensor([2]), 1e3)).sum()
    far = (rotate(q, torch.tensor([105]), 1e3) * rotate(k, torch.tensor([102]), 1e3)).sum()
    torch.testing.assert_close(near, far, rtol=1e-4, atol=1e-5)
