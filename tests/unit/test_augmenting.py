"""The Augmenting Block: init from the target's last layers, equality with HF Llama and with
a loop-by-loop reference of a decoder layer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import D, V, randomize, tiny_config
from vllm_clover.modeling import AugmentingBlock, CloverConfig, select_last_layers
from vllm_clover.modeling.augmenting import DecoderLayer

pytestmark = pytest.mark.unit


def tiny_llama(num_layers: int):
    """A random 'target': a tiny transformers LlamaModel and its config."""
    transformers = pytest.importorskip("transformers")
    target_cfg = transformers.LlamaConfig(
        hidden_size=D,
        intermediate_size=48,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.LlamaModel(target_cfg).eval(), target_cfg


def test_init_from_target_copies_weights() -> None:
    target, target_cfg = tiny_llama(num_layers=3)
    cfg = CloverConfig.from_target_config(target_cfg, num_heads=2, num_augmenting_layers=2)
    block = AugmentingBlock(cfg)
    state = {f"model.{k}": v for k, v in target.state_dict().items()}  # prefixes are stripped
    states = select_last_layers(state, 2)
    block.init_from_target(states, state["model.norm.weight"])
    for j, src in ((0, 1), (1, 2)):
        for name, p in block.layers[j].named_parameters():
            assert torch.equal(p, state[f"model.layers.{src}.{name}"]), name
    assert torch.equal(block.norm.weight, state["model.norm.weight"])

    broken = {k: v for k, v in states[0].items() if k != "mlp.up_proj.weight"}
    with pytest.raises(ValueError, match="mlp.up_proj.weight"):
        block.init_from_target([broken, states[1]], state["model.norm.weight"])
    with pytest.raises(ValueError, match="norm.weight"):
        block.init_from_target(states, torch.randn(D + 1))
    with pytest.raises(ValueError, match="3 target layer states for 2 augmenting layers"):
        block.init_from_target(select_last_layers(state, 3), state["model.norm.weight"])


def test_select_last_layers_worked_example() -> None:
    state = {f"model.layers.{i}.mlp.w": torch.tensor([float(i)]) for i in range(4)}
    assert [s["mlp.w"].item() for s in select_last_layers(state, 2)] == [2.0, 3.0]
    with pytest.raises(ValueError, match="has 4 decoder layers, need 5"):
        select_last_layers(state, 5)


def test_block_matches_transformers_llama() -> None:
    """A block initialised from a 2-layer HF Llama equals that model run on inputs_embeds."""
    target, target_cfg = tiny_llama(num_layers=2)
    cfg = CloverConfig.from_target_config(target_cfg, num_heads=2, num_augmenting_layers=2)
    block = AugmentingBlock(cfg)
    state = target.state_dict()
    block.init_from_target(select_last_layers(state, 2), state["norm.weight"])
    hidden, positions = torch.randn(2, 6, D), torch.arange(6) + 4
    with torch.no_grad():
        expected = target(inputs_embeds=hidden, position_ids=positions.expand(2, 6))
        got = block(hidden, positions)
    torch.testing.assert_close(got, expected.last_hidden_state, rtol=1e-5, atol=1e-5)


def rms(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(vec: torch.Tensor, pos: float, theta: float) -> torch.Tensor:
    """RoPE by hand: rotate each pair (c, c + hd/2) of vec (hd,) by pos * theta^(-2c/hd)."""
    hd, out = vec.shape[0], vec.clone()
    for c in range(hd // 2):
        cos, sin = math.cos(pos * theta ** (-2 * c / hd)), math.sin(pos * theta ** (-2 * c / hd))
        a, b = vec[c], vec[c + hd // 2]
        out[c], out[c + hd // 2] = a * cos - b * sin, b * cos + a * sin
    return out


def naive_decoder_layer(layer: DecoderLayer, x: torch.Tensor, pos: torch.Tensor, cfg: CloverConfig):
    """Loop reference for x (T, D): per-query softmax over keys <= t, GQA by head index."""
    att, hd, eps = layer.self_attn, cfg.head_dim, cfg.rms_norm_eps
    nh, nkv, T = cfg.num_attention_heads, cfg.num_key_value_heads, x.shape[0]
    xn = rms(x, layer.input_layernorm.weight, eps)
    q = (xn @ att.q_proj.weight.T).view(T, nh, hd)
    k = (xn @ att.k_proj.weight.T).view(T, nkv, hd)
    v = (xn @ att.v_proj.weight.T).view(T, nkv, hd)
    y = torch.zeros(T, nh, hd)
    for h in range(nh):
        g = h // (nh // nkv)
        for t in range(T):
            qt = rotate(q[t, h], float(pos[t]), cfg.rope_theta)
            keys = [rotate(k[s, g], float(pos[s]), cfg.rope_theta) for s in range(t + 1)]
            scores = torch.stack([qt @ key for key in keys]) / math.sqrt(hd)
            y[t, h] = (scores.softmax(0).unsqueeze(-1) * v[: t + 1, g]).sum(0)
    h1 = x + y.reshape(T, nh * hd) @ att.o_proj.weight.T
    hn, mlp = rms(h1, layer.post_attention_layernorm.weight, eps), layer.mlp
    gated = F.silu(hn @ mlp.gate_proj.weight.T) * (hn @ mlp.up_proj.weight.T)
    return h1 + gated @ mlp.down_proj.weight.T


def test_decoder_layer_and_block_match_naive_reference() -> None:
    cfg = tiny_config(hidden_size=16, num_attention_heads=4, num_key_value_heads=2)
    block = AugmentingBlock(cfg)
    randomize(block, seed=1)  # random weights, norm weights around 1
    x, positions = torch.randn(1, 5, 16), torch.arange(5) + 7
    with torch.no_grad():
        slow = naive_decoder_layer(block.layers[0], x[0], positions, cfg)
        fast = block.layers[0](x, positions.unsqueeze(0))
        torch.testing.assert_close(fast[0], slow, rtol=1e-5, atol=1e-5)
        expected = rms(slow, block.norm.weight, cfg.rms_norm_eps)  # block = norm(layers(H))
        torch.testing.assert_close(block(x, positions)[0], expected, rtol=1e-5, atol=1e-5)


def test_positions_are_checked() -> None:
    block = AugmentingBlock(tiny_config())
    with pytest.raises(ValueError, match=r"positions must be \(T,\) or \(B, T\)"):
        block(torch.randn(2, 4, D), torch.arange(5))
