"""LayerFusion: the target's middle layers fused into H, zero at start, and their checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import D, random_clover, tiny_config
from vllm_clover.modeling import CloverModel, load_clover, save_clover
from vllm_clover.modeling.clover import split_checkpoint_state
from vllm_clover.modeling.layer_fusion import LayerFusion, signal_columns

pytestmark = pytest.mark.unit

CLOVER2 = dict(fuse_next_token=True, head_projection="linear", num_augmenting_layers=2)


def signal_of(hidden: torch.Tensor, seed: int, slots: int) -> torch.Tensor:
    """[H | L_a | ...]: H followed by ``slots`` random layers of a larger scale (as a
    residual stream is), (B, T, (1 + slots) * D)."""
    gen = torch.Generator().manual_seed(seed)
    layers = [5.0 * torch.randn(hidden.shape, generator=gen) for _ in range(slots)]
    return torch.cat([hidden, *layers], dim=-1)


def test_fresh_fusion_is_h_and_trained_fusion_reads_each_layer() -> None:
    """Zero W_j: the heads read exactly H (so warm starts keep their drafts); with W_j set,
    x = H + sum_j W_j rmsnorm_j(L_j), and each layer's columns change x."""
    cfg = tiny_config(target_layers=[1, 3], target_num_hidden_layers=4, **CLOVER2)
    model, _ = random_clover(cfg)
    plain = CloverModel(tiny_config(**CLOVER2))
    state = {k: v for k, v in model.checkpoint_state().items() if "layer_fusion" not in k}
    plain.load_checkpoint_state(state)
    plain.attach_target(model.tables.lm_head)
    hidden = torch.randn(2, 7, D)  # (B, T, D)
    signal = signal_of(hidden, 0, 2)  # (B, T, 3D)
    ids = torch.randint(0, cfg.vocab_size, (2, 7, cfg.num_heads))
    fusion = model.fusion
    with torch.no_grad():
        for proj in fusion.projs:
            proj.weight.zero_()
        assert torch.allclose(model(signal, ids), plain(hidden, ids), atol=1e-5)
        for proj in fusion.projs:
            proj.weight.normal_(0, 0.1)
    x = fusion(signal)  # (B, T, D)
    expect = hidden.clone()
    for a in range(2):
        layer = signal[..., (1 + a) * D : (2 + a) * D]
        expect += fusion.projs[a](fusion.norms[a](layer))
    assert torch.allclose(x, expect, atol=1e-5)
    for a in range(2):
        moved = signal.clone()
        moved[..., (1 + a) * D : (2 + a) * D] += 1.0
        assert not torch.allclose(fusion(moved), x)
    assert not torch.allclose(model(signal, ids), plain(hidden, ids), atol=1e-3)


def test_a_signal_of_the_wrong_width_is_refused_by_name() -> None:
    fusion = LayerFusion(tiny_config(target_layers=[2]))
    with pytest.raises(ValueError, match=f"width {D}; these heads read H and 1 .*: {2 * D}"):
        fusion(torch.randn(3, D))
    with pytest.raises(ValueError, match="needs CloverConfig.target_layers"):
        LayerFusion(tiny_config())


def test_signal_columns_pick_a_models_layers_from_a_wider_signal() -> None:
    """The docstring's example, and the union eval-heads prepares for several checkpoints."""
    cols = signal_columns([2, 15, 27], [15], 4)
    assert cols.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert signal_columns([2, 15], [2, 15], 4) is None
    assert signal_columns([2, 15], [], 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"carries layers \[2\], not \[15\]"):
        signal_columns([2], [15], 4)


def test_fusion_tensors_are_stored_under_their_prefix_and_load_back(tmp_path: Path) -> None:
    cfg = tiny_config(target_layers=[1, 2], target_num_hidden_layers=3, **CLOVER2)
    model, lm_head = random_clover(cfg)
    state = model.checkpoint_state()
    names = {n for n in state if n.startswith("layer_fusion.")}
    assert names == {
        f"layer_fusion.{part}.{a}.weight" for part in ("norms", "projs") for a in (0, 1)
    }
    parts = split_checkpoint_state(state)
    assert set(parts.fusion) == set(model.fusion.state_dict())
    assert not any(n.startswith("layer_fusion") for n in parts.heads)
    save_clover(model, cfg, tmp_path / "heads", dtype=torch.float32)
    again = load_clover(tmp_path / "heads", lm_head)
    assert again.config.target_layers == [1, 2]
    assert all(torch.equal(t, again.checkpoint_state()[n]) for n, t in state.items())
    with pytest.raises(ValueError, match="unexpected layer_fusion weights"):
        CloverModel(tiny_config(**CLOVER2)).load_checkpoint_state(state)
