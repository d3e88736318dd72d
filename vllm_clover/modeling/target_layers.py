"""Which target decoder layers the Augmenting Block can mirror, and how to read their weights.

The block is a pre-norm Llama layer (plain RMSNorm and RoPE, 1/sqrt(head_dim) scores, full
causal attention, SiLU SwiGLU MLP). Any other target's block is refused, naming what does not
fit, before training: heads never train on a block that silently computes something else.
Which targets fit, and an example: docs/training.md, "Which targets, and the Augmenting Block".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

LLAMA_LAYER = frozenset(
    {
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    }
)
OPTIONAL_BIASES = frozenset(f"self_attn.{p}_proj.bias" for p in "qkvo")
# A fused projection and its parts, stacked in this order along the output rows.
FUSED = {
    "self_attn.qkv_proj.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
OFFSET_NORM_FAMILIES = ("gemma",)  # model types whose RMSNorm scales by (1 + weight)


def strip_layer_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """'model.layers.31.self_attn.q_proj.weight' -> 'self_attn.q_proj.weight'; keys without a
    layer prefix are kept as they are, rotary caches (inv_freq) dropped."""
    out = {}
    for key, value in state.items():
        if not key.endswith("inv_freq"):
            match = re.search(r"(?:^|\.)layers\.\d+\.(.+)$", key)
            out[match.group(1) if match else key] = value
    return out


def parameter_names(raw: Mapping[str, torch.Tensor]) -> set[str]:
    """A target layer's parameter names under the block's names (fused ones as their parts)."""
    names = set()
    for name in strip_layer_prefix(raw):
        names.update(FUSED.get(name, (name,)))
    return names


def layer_weights(raw: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """One target layer's weights under the block's names: prefixes stripped, fused
    projections split by the CloverConfig's head counts and widths. Example (Phi-3, H = KV =
    32, hd = 96): qkv_proj (9216, 3072) -> q_proj, k_proj, v_proj, each (3072, 3072)."""
    state = strip_layer_prefix(raw)
    q, kv = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )
    sizes = {
        "self_attn.qkv_proj.weight": [q, kv, kv],
        "mlp.gate_up_proj.weight": [config.intermediate_size] * 2,
    }
    for fused, parts in FUSED.items():
        if fused in state:
            for name, tensor in zip(parts, state.pop(fused).split(sizes[fused]), strict=True):
                state[name] = tensor
    return state


def select_last_layers(
    state_dict: Mapping[str, torch.Tensor], num_layers: int
) -> list[dict[str, torch.Tensor]]:
    """The last ``num_layers`` decoder layers of a full target state dict, in order, keys
    relative to the layer. Example: a 32-layer Llama and num_layers=2 -> [state of layers.30,
    state of layers.31], each with keys like 'self_attn.q_proj.weight'."""
    by_index: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        match = re.search(r"(?:^|\.)layers\.(\d+)\.(.+)$", key)
        if match:
            by_index.setdefault(int(match.group(1)), {})[match.group(2)] = value
    if len(by_index) < num_layers:
        raise ValueError(f"target state dict has {len(by_index)} decoder layers, need {num_layers}")
    return [by_index[i] for i in sorted(by_index)[-num_layers:]]


def hidden_activation(text_config: Any) -> str:
    """The MLP activation, whichever name the config gives it (hidden_act, hidden_activation)."""
    return getattr(text_config, "hidden_act", None) or getattr(
        text_config, "hidden_activation", "silu"
    )


def rope_parameters(text_config: Any) -> dict[str, Any]:
    """The RoPE parameters of the last layer: flat ({"rope_theta": ...}), per layer type
    ({"full_attention": {...}, "sliding_attention": {...}} with layer_types), or legacy
    (rope_theta, rope_scaling attributes)."""
    params = dict(getattr(text_config, "rope_parameters", None) or {})
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types and layer_types[-1] in params:
        params = dict(params[layer_types[-1]])
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(text_config, "rope_theta", 10000.0)
        params.update(getattr(text_config, "rope_scaling", None) or {})
    return params


def bias_fields(layer_names: set[str]) -> dict[str, bool]:
    """CloverConfig's bias fields from the parameters the target's layer has."""
    return {
        "qkv_bias": "self_attn.q_proj.bias" in layer_names,
        "attention_bias": "self_attn.o_proj.bias" in layer_names,
    }


def mirror_problems(text_config: Any, layer_names: set[str]) -> list[str]:
    """What keeps the block from computing what the target's last layer computes ([] = it
    can mirror it). layer_names: that layer's parameter names (as from ``layer_weights``)."""
    problems = []
    activation = hidden_activation(text_config)
    if activation not in ("silu", "swish"):
        problems.append(f"its MLP activation is {activation!r}, the block's is SiLU (SwiGLU)")
    rope = rope_parameters(text_config)
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(
            f"its RoPE is {rope.get('rope_type', rope.get('type'))!r}, the block's plain"
        )
    partial = rope.get("partial_rotary_factor", getattr(text_config, "partial_rotary_factor", 1))
    if partial not in (None, 1, 1.0):
        problems.append(f"it rotates a {partial} share of each head, the block all of it")
    if str(getattr(text_config, "model_type", "")).startswith(OFFSET_NORM_FAMILIES):
        problems.append("its RMSNorm scales by (1 + weight), the block's by weight")
    problems += _attention_problems(text_config)
    unknown = sorted(layer_names - LLAMA_LAYER - OPTIONAL_BIASES)
    missing = sorted(LLAMA_LAYER - layer_names)
    if unknown:
        problems.append(f"its last layer has parameters the block does not: {unknown}")
    if missing:
        problems.append(f"its last layer lacks {missing} (a pre-norm layer has them)")
    return problems


def _attention_problems(text_config: Any) -> list[str]:
    problems = []
    heads = getattr(text_config, "num_attention_heads", 1)
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    scalar = getattr(text_config, "query_pre_attn_scalar", None)
    if scalar is not None and scalar != head_dim:
        problems.append(f"it scales attention scores by 1/sqrt({scalar}), not 1/sqrt(head_dim)")
    if getattr(text_config, "attn_logit_softcapping", None):
        problems.append("it soft-caps attention scores")
    layer_types = getattr(text_config, "layer_types", None)
    window = getattr(text_config, "sliding_window", None)
    sliding = (
        layer_types[-1] == "sliding_attention"
        if layer_types
        else bool(window) and getattr(text_config, "use_sliding_window", True)
    )
    longest = getattr(text_config, "max_position_embeddings", None)
    if sliding and not (window and longest and window >= longest):  # a window that never slides
        problems.append(
            f"its last layer attends through a sliding window of {window} tokens, the block "
            "to the whole context"
        )
    return problems
