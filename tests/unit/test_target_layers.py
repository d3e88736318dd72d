"""Which target layers the Augmenting Block mirrors: tiny random Hugging Face targets of six
architectures, built here; the block copied from the last layer of an accepted one computes
exactly that layer, every other one is refused naming what differs."""

from __future__ import annotations

import pytest
import torch

from tiny_targets import tiny_target_config
from vllm_clover.modeling import AugmentingBlock, CloverConfig
from vllm_clover.modeling.target_layers import (
    bias_fields,
    layer_weights,
    mirror_problems,
    parameter_names,
    rope_parameters,
    select_last_layers,
    strip_layer_prefix,
)

pytestmark = pytest.mark.unit

MIRRORED = ["llama", "mistral", "qwen2", "phi3"]
REFUSED = {
    "gemma3": [
        "its MLP activation is 'gelu_pytorch_tanh'",
        "its RMSNorm scales by (1 + weight)",
        "'self_attn.k_norm.weight', 'self_attn.q_norm.weight'",
        "'post_feedforward_layernorm.weight', 'pre_feedforward_layernorm.weight'",
    ],
    "olmo2": [
        "'post_feedforward_layernorm.weight', 'self_attn.k_norm.weight'",
        "its last layer lacks ['input_layernorm.weight']",
    ],
}


def tiny_target(architecture: str):
    special = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    config, model_class = tiny_target_config(architecture, 97, hidden_size=32, **special)
    torch.manual_seed(0)
    return model_class(config).eval(), config


@pytest.mark.parametrize("architecture", MIRRORED)
def test_a_block_copied_from_the_last_layer_computes_it(architecture: str) -> None:
    target, target_config = tiny_target(architecture)
    state = target.state_dict()
    (last,) = select_last_layers(state, 1)
    assert mirror_problems(target_config, parameter_names(last)) == []
    config = CloverConfig.from_target_config(target_config, **bias_fields(parameter_names(last)))
    block = AugmentingBlock(config)
    block.init_from_target(last, state["model.norm.weight"])
    ids = torch.arange(1, 13).unsqueeze(0)
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        got = block(hidden[-2], torch.arange(12))  # the last layer's input -> the final H
    torch.testing.assert_close(got, hidden[-1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", sorted(REFUSED))
def test_other_layers_are_refused_naming_what_differs(architecture: str) -> None:
    target, target_config = tiny_target(architecture)
    (last,) = select_last_layers(target.state_dict(), 1)
    problems = "; ".join(mirror_problems(target_config, parameter_names(last)))
    for expected in REFUSED[architecture]:
        assert expected in problems, problems


def test_qwen2_biases_and_phi3_fused_projections_are_read() -> None:
    qwen, _ = tiny_target("qwen2")
    assert bias_fields(parameter_names(select_last_layers(qwen.state_dict(), 1)[0])) == {
        "qkv_bias": True,
        "attention_bias": False,
    }
    phi, phi_config = tiny_target("phi3")
    (last,) = select_last_layers(phi.state_dict(), 1)
    assert "self_attn.qkv_proj.weight" in last
    weights = layer_weights(last, CloverConfig.from_target_config(phi_config))
    assert weights["self_attn.k_proj.weight"].shape == (16, 32)  # 2 KV heads x 8
    assert torch.equal(weights["mlp.up_proj.weight"], last["mlp.gate_up_proj.weight"][64:])


def test_rope_and_activation_are_read_under_every_name() -> None:
    _, gemma = tiny_target("gemma3")
    assert (
        rope_parameters(gemma)["rope_theta"]
        == gemma.rope_parameters["full_attention"]["rope_theta"]
    )  # the last layer's type is full attention
    heads_only = CloverConfig.from_target_config(gemma, use_augmenting_block=False)
    assert heads_only.hidden_act == "gelu_pytorch_tanh"
    assert strip_layer_prefix({"model.layers.3.mlp.w": 1, "x.inv_freq": 2, "norm.w": 3}) == {
        "mlp.w": 1,
        "norm.w": 3,
    }


def test_a_window_that_never_slides_is_no_problem() -> None:
    _, mistral = tiny_target("mistral")
    mistral.sliding_window, mistral.max_position_embeddings = 4096, 32768
    (problem,) = [p for p in mirror_problems(mistral, set()) if "sliding" in p]
    assert "a sliding window of 4096 tokens" in problem
    mistral.sliding_window = mistral.max_position_embeddings
    assert not [p for p in mirror_problems(mistral, set()) if "sliding" in p]
