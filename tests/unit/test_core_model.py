"""CloverDraftModel's pieces that need no engine: the vLLM layer config of the Augmenting
Block and the tables it builds for one rank or for tensor parallelism."""

from __future__ import annotations

import pytest

from helpers import tiny_config
from vllm_clover.core.model import augmenting_layer_config, build_tables
from vllm_clover.modeling import TargetTables

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("attention_bias", "qkv_bias"), [(False, False), (False, True), (True, True), (True, False)]
)
def test_augmenting_layer_config_keeps_both_biases(attention_bias: bool, qkv_bias: bool):
    """vLLM's Llama layer biases o_proj by attention_bias and q/k/v by qkv_bias when set
    (Qwen2: q/k/v only), as the trainer's layer does."""
    config = tiny_config(attention_bias=attention_bias, qkv_bias=qkv_bias, rope_theta=5e5)
    layer = augmenting_layer_config(config)
    assert (layer.attention_bias, layer.qkv_bias) == (attention_bias, qkv_bias)
    assert layer.rope_parameters["rope_theta"] == 5e5
    assert (layer.num_key_value_heads, layer.head_dim) == (2, 8)


def test_one_rank_gets_plain_tables():
    assert type(build_tables(tiny_config(), tensor_parallel_size=1)) is TargetTables
