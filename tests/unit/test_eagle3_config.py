"""The EAGLE-3 drafter's shape from its target, and the flags of `train-eagle3`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.eagle3.config import Eagle3Config

pytestmark = pytest.mark.unit


def test_shape_and_target_layers_follow_the_target() -> None:
    """SmolLM2-135M's config -> its width, heads and RoPE, and vLLM's default aux layers."""
    smollm2 = SimpleNamespace(
        num_hidden_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        max_position_embeddings=8192,
        vocab_size=49152,
    )
    config = Eagle3Config.from_target(smollm2, draft_vocab_size=8192, ttt_steps=4)
    assert config.aux_layers == (2, 15, 27)
    assert (config.head_dim, config.rope_theta, config.num_key_value_heads) == (64, 1e5, 3)
    layer = config.speculators_json("t")["transformer_layer_config"]
    assert (layer["num_hidden_layers"], layer["hidden_size"], layer["head_dim"]) == (1, 576, 64)
    assert Eagle3Config.from_json(config.speculators_json("t")) == config
    no_head_dim = SimpleNamespace(**{**vars(smollm2), "head_dim": None})
    assert Eagle3Config.from_target(no_head_dim, 8192, (3, 7)).head_dim == 64
