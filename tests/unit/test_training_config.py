"""Training configs: the Clover-2 preset, its defaults, and the settings refused together."""

from __future__ import annotations

import pytest

from vllm_clover.training.config import TrainConfig, TrainingError

pytestmark = pytest.mark.unit


def test_clover2_preset_and_its_defaults() -> None:
    two = TrainConfig(target="t", out="o", clover2=True)
    assert two.fuse_next_token and two.head_projection == "linear" and two.augmenting_block
    assert (two.num_augmenting_layers, two.head_weight_base, two.hidden_loss_weight) == (2, 0.7, 10)
    mine = TrainConfig(
        target="t", out="o", clover2=True, num_augmenting_layers=1, hidden_loss_weight=0.0
    )
    assert (mine.num_augmenting_layers, mine.hidden_loss_weight) == (1, 0.0)
    plain = TrainConfig(target="t", out="o")
    assert (plain.num_augmenting_layers, plain.head_weight_base, plain.hidden_loss_weight) == (
        1,
        0.8,
        0.0,
    )
    ablated = TrainConfig(target="t", out="o", clover2=True, attention_decoder=False)
    assert not ablated.attention_decoder and ablated.fuse_next_token  # the ablation is kept
    with pytest.raises(TrainingError, match="exclude each other"):
        TrainConfig(target="t", out="o", clover2=True, medusa=True)
    with pytest.raises(TrainingError, match="--label-top-k must be > 0"):
        TrainConfig(target="t", out="o", label_top_k=0)
    with pytest.raises(TrainingError, match="needs soft labels"):
        TrainConfig(target="t", out="o", label_top_k=4, soft_labels=False)
    with pytest.raises(TrainingError, match="need the Augmenting Block"):
        TrainConfig(target="t", out="o", augmenting_gate=True, augmenting_block=False)
