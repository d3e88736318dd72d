"""CloverConfig: validation, Medusa and Clover-2 settings, serialisation, reading a target
config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import D, V, tiny_config
from vllm_clover.modeling import CloverConfig, load_clover_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(decoder_num_heads=5), "decoder_num_heads=5"),
        (dict(num_heads=0), "num_heads must be >= 1"),
        (dict(regressive_embedding="tied"), 'regressive_embedding must be "lm_head"'),
        (
            dict(regressive_embedding="input_embedding"),
            "regressive_embedding must be \"lm_head\", got 'input_embedding'",
        ),
        (dict(draft_vocab_size=V + 1), "draft_vocab_size"),
        (dict(num_key_value_heads=3), "num_key_value_heads=3"),
        (dict(hidden_act="gelu"), "silu"),
        (dict(target_hidden_size=D + 1), "target_hidden_size"),
        (dict(num_heads=2, draft_confidence=[0.1]), "one threshold per head \\(2\\), got 1"),
        (dict(num_heads=2, draft_confidence=[0.1, -1]), "draft_confidence: thresholds are"),
        (dict(num_heads=2, token_tree="[(0,), (0, 0), (0, 0, 0)]"), "token_tree: path"),
        (dict(token_tree="[(0,), (1, 0)]"), r"token_tree: path \(1, 0\) has no parent"),
        (dict(head_projection="mlp"), "head_projection must be one of"),
        (dict(fuse_next_token=True, use_augmenting_block=False), "fuse_next_token fuses"),
        (dict(fuse_next_token=True, use_regressive_connection=False), "fuse_next_token fuses"),
        (dict(augmenting_gate=True, use_augmenting_block=False), "augmenting_gate gates"),
        (
            dict(fuse_next_token=True, use_attention_decoder=False, decoder_num_heads=5),
            "decoder_num_heads=5",
        ),
        (dict(target_layers=[]), "target_layers: must be a non-empty list"),
        (dict(target_layers=[15, 2]), "target_layers: must be strictly increasing"),
        (dict(target_layers=[2, 2]), "target_layers: must be strictly increasing"),
        (dict(target_layers=[0]), r"target_layers: layer 0 is not in >= 1"),
        (
            dict(target_layers=[2, 30], target_num_hidden_layers=30),
            r"layer 30 is not in \[1, 29\] \(the target has 30 layers\)",
        ),
    ],
)
def test_config_validation(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_config_medusa_and_round_trip() -> None:
    off = dict(use_augmenting_block=False, use_attention_decoder=False)
    med = CloverConfig(
        hidden_size=D, vocab_size=V, num_heads=4, **off, use_regressive_connection=False
    )
    assert med.is_medusa and med.num_hidden_layers == 0 and med.architectures == ["CloverModel"]
    assert not tiny_config().is_medusa and tiny_config().num_hidden_layers == 1
    with pytest.raises(ValueError, match="num_hidden_layers is derived"):
        tiny_config(num_hidden_layers=2)
    cfg = tiny_config(draft_vocab_size=40, target_name="tiny", target_lm_head_fingerprint="v1:x")
    again = CloverConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict() and again.model_type == "clover"


def test_config_clover2() -> None:
    """Clover-2's settings (as training/config.py's --clover2 sets them) round-trip."""
    shape = dict(hidden_size=D, vocab_size=V, num_heads=4, num_attention_heads=4)
    clover2 = dict(num_augmenting_layers=2, fuse_next_token=True, head_projection="linear")
    cfg = CloverConfig(**shape, **clover2, intermediate_size=48)
    assert cfg.num_hidden_layers == 2 and cfg.use_attention_decoder and not cfg.augmenting_gate
    again = CloverConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()


def test_shipped_configs_with_the_regressive_embedding_field_load() -> None:
    """The shipped config.json files say regressive_embedding "lm_head": they still read."""
    shipped = sorted((Path(__file__).parents[2] / "checkpoints").glob("*/config.json"))
    recorded = [p for p in shipped if "regressive_embedding" in json.loads(p.read_text())]
    assert recorded, "no shipped config.json records regressive_embedding"
    for path in recorded:
        assert load_clover_config(path.parent).regressive_embedding == "lm_head"


def test_from_target_config_copies_the_layer_shape() -> None:
    transformers = pytest.importorskip("transformers")
    target = transformers.LlamaConfig(
        hidden_size=D,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
    )
    cfg = CloverConfig.from_target_config(target, num_heads=2, num_augmenting_layers=2)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.num_key_value_heads, cfg.head_dim) == (
        500.0,
        1e-5,
        2,
        8,
    )
    assert (cfg.num_heads, cfg.num_augmenting_layers, cfg.qkv_bias) == (2, 2, False)
    qwen = transformers.Qwen2Config(
        hidden_size=D,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
    )
    assert CloverConfig.from_target_config(qwen).qkv_bias is True
