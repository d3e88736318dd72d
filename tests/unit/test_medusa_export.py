"""Medusa export: names, shapes, dtypes, refusal of Clover components, and vLLM's own Medusa
loader reading the exported folder and drafting what the heads draft."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from helpers import D, K, V, random_clover, tiny_config
from vllm_clover.modeling import CloverConfig
from vllm_clover.training.medusa_export import export_medusa, medusa_model_card

pytestmark = pytest.mark.unit
# Medusa-1 heads: every Clover component off
MEDUSA = dict(
    use_augmenting_block=False, use_attention_decoder=False, use_regressive_connection=False
)


def medusa_config(**overrides) -> CloverConfig:
    return CloverConfig(hidden_size=D, vocab_size=V, num_heads=K, **MEDUSA, **overrides)


def trained_model(cfg: CloverConfig):
    return random_clover(cfg, scale=0.1)


def test_export_medusa_refuses_clover_components(tmp_path: Path) -> None:
    for flag in MEDUSA:
        cfg = tiny_config(**{**MEDUSA, flag: True})
        model, lm_head = trained_model(cfg)
        with pytest.raises(ValueError, match="Clover component"):
            export_medusa(model, tmp_path / flag, lm_head)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("draft_vocab_size", [None, 50])
def test_export_medusa_names_and_shapes(tmp_path: Path, draft_vocab_size: int | None) -> None:
    cfg = medusa_config(draft_vocab_size=draft_vocab_size)
    model, lm_head = trained_model(cfg)
    out = export_medusa(model, tmp_path / "medusa", lm_head)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    assert (
        config["hidden_size"],
        config["vocab_size"],
        config["num_heads"],
        config["num_hidden_layers"],
    ) == (D, V, K, 1)
    state = load_file(out / "model.safetensors")
    expected = {
        f"blocks.{i}.layers.0.{p}": (D, D) if p == "weight" else (D,)
        for i in range(K)
        for p in ("weight", "bias")
    }
    if draft_vocab_size is None:
        expected.update({f"lm_heads.{i}.weight": (V, D) for i in range(K)})
    else:
        expected.update(
            {"lm_heads.0.weight": (draft_vocab_size, D), "token_map": (draft_vocab_size,)}
        )
        assert (
            config["truncated_vocab_size"] == draft_vocab_size
            and config["original_lm_head"] is True
        )
        assert torch.equal(state["token_map"], model.tables.draft_vocab_ids)
    assert {n: tuple(t.shape) for n, t in state.items()} == expected


@pytest.fixture(scope="module")
def vllm_medusa():
    """vLLM's own Medusa code (skipped when vLLM is not installed)."""
    medusa = pytest.importorskip("vllm.model_executor.models.medusa")
    configs = pytest.importorskip("vllm.transformers_utils.configs.medusa")
    return SimpleNamespace(
        Medusa=medusa.Medusa, ResidualBlock=medusa.ResidualBlock, MedusaConfig=configs.MedusaConfig
    )


class MedusaStandIn(torch.nn.Module):
    """vLLM's Medusa layout with nn.Linear in place of ParallelLMHead (which needs a TP group)."""

    def __init__(self, config, vllm_medusa: SimpleNamespace) -> None:
        super().__init__()
        self.config = config
        self._remap_old_checkpoint_key = vllm_medusa.Medusa._remap_old_checkpoint_key
        residual_block_cls = vllm_medusa.ResidualBlock
        d, n = config.hidden_size, config.num_heads
        self.blocks = torch.nn.ModuleList(
            [residual_block_cls(config, d, config.num_hidden_layers) for _ in range(n)]
        )
        self.orig_vocab_size, self.truncated_vocab_size = (
            config.vocab_size,
            config.truncated_vocab_size,
        )
        if getattr(config, "original_lm_head", False):
            self.lm_head = torch.nn.Linear(d, self.truncated_vocab_size, bias=False)
            self.lm_heads = [self.lm_head] * n
        else:
            self.lm_heads = torch.nn.ModuleList(
                [torch.nn.Linear(d, config.vocab_size, bias=False) for _ in range(n)]
            )
        self.token_map = None

    def draft(self, hidden: torch.Tensor) -> torch.Tensor:
        """MedusaProposer.propose: per-head argmax over the full vocab (token_map scatter)."""
        drafts = []
        for block, head in zip(self.blocks, self.lm_heads, strict=True):
            logits = head(block(hidden))
            if self.token_map is not None:
                full = torch.full((*logits.shape[:-1], self.orig_vocab_size), -torch.inf)
                full[..., self.token_map] = logits
                logits = full
            drafts.append(logits.argmax(-1))
        return torch.stack(drafts, dim=1)


@pytest.mark.parametrize("draft_vocab_size", [None, 50])
def test_export_medusa_loads_in_vllm_losslessly(
    tmp_path: Path, vllm_medusa, draft_vocab_size: int | None
) -> None:
    cfg = medusa_config(draft_vocab_size=draft_vocab_size)
    model, lm_head = trained_model(cfg)
    out = export_medusa(model, tmp_path / "medusa", lm_head)
    config = vllm_medusa.MedusaConfig.from_pretrained(str(out))
    assert (config.num_heads, config.num_hidden_layers, config.medusa_fc_bias) == (K, 1, True)
    assert config.truncated_vocab_size == (draft_vocab_size or V)
    stand_in = MedusaStandIn(config, vllm_medusa)
    weights = load_file(out / "model.safetensors").items()
    from vllm_clover.patches import apply_patches

    apply_patches()  # as in every vLLM process: the medusa_token_map patch reports token_map
    with torch.no_grad():
        loaded = vllm_medusa.Medusa.load_weights(stand_in, weights)  # vLLM's own loader
    assert loaded == {n for n, _ in stand_in.named_parameters()}
    hidden = torch.randn(6, D)
    with torch.no_grad():
        assert torch.equal(
            stand_in.draft(hidden), model.propose(hidden, torch.zeros(6, dtype=torch.long), K)
        )


def test_export_in_bf16(tmp_path: Path) -> None:
    medusa_cfg = medusa_config(draft_vocab_size=50)
    medusa, lm_head = trained_model(medusa_cfg)
    out = export_medusa(medusa, tmp_path / "medusa", lm_head, dtype=torch.bfloat16)
    exported = load_file(out / "model.safetensors")
    assert exported["lm_heads.0.weight"].dtype == torch.bfloat16
    assert exported["token_map"].dtype == torch.int64
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_model_card_serves_the_folder_and_keeps_the_source_card() -> None:
    card = medusa_model_card(
        "# Heads\n\nheld-out tau 1.2\n", "vllm-clover export-medusa ...", "tiny", 3
    )
    assert '"method": "medusa"' in card and "## Heads" in card and "held-out tau 1.2" in card
    assert "(the source heads had no model card)" in medusa_model_card(None, "cmd", "tiny", 3)
