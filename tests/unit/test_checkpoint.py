"""Unit tests for the Clover checkpoint format, its validation and the Medusa export."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vllm_clover.modeling import (
    CloverCheckpointError,
    CloverConfig,
    CloverHeads,
    export_medusa,
    lm_head_fingerprint,
    load_clover,
    save_clover,
    shift_tokens_for_heads,
)
from vllm_clover.modeling import checkpoint as checkpoint_module

pytestmark = pytest.mark.unit

D, V, K = 32, 120, 3


def tiny_config(**overrides) -> CloverConfig:
    fields = dict(
        hidden_size=D,
        vocab_size=V,
        num_heads=K,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        decoder_num_heads=4,
        target_name="tiny-target",
    )
    fields.update(overrides)
    return CloverConfig(**fields)


def trained_model(
    cfg: CloverConfig, dtype: torch.dtype = torch.float32
) -> tuple[CloverHeads, torch.Tensor]:
    """A model with random weights (a draft vocab if configured) and its target LM head."""
    torch.manual_seed(0)
    model = CloverHeads(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if cfg.draft_vocab_size:
        model.set_draft_vocab(torch.randperm(V)[: cfg.draft_vocab_size].sort().values)
    model.to(dtype)
    lm_head = torch.randn(V, D).to(dtype)
    model.attach_target(lm_head)
    return model, lm_head


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, CloverHeads, torch.Tensor]:
    cfg = tiny_config(draft_vocab_size=50)
    model, lm_head = trained_model(cfg)
    out = save_clover(model, cfg, tmp_path / "ckpt", model_card="# tiny clover\n")
    return out, model, lm_head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("draft_vocab_size", [None, 50])
def test_save_load_round_trip(
    tmp_path: Path, dtype: torch.dtype, draft_vocab_size: int | None
) -> None:
    cfg = tiny_config(draft_vocab_size=draft_vocab_size)
    model, lm_head = trained_model(cfg, dtype)
    save_clover(model, cfg, tmp_path / "ckpt")
    loaded = load_clover(tmp_path / "ckpt", lm_head, target_name="tiny-target")
    hidden, ids = torch.randn(2, 7, D), torch.randint(0, V, (2, 7))
    head_inputs = shift_tokens_for_heads(ids, K).input_ids
    with torch.no_grad():
        assert torch.equal(loaded(hidden, head_inputs), model(hidden, head_inputs))
    h0, t0 = torch.randn(3, D), torch.randint(0, V, (3,))
    assert torch.equal(loaded.propose(h0, t0, K), model.propose(h0, t0, K))
    assert loaded.dtype == dtype and loaded.lm_head_weight.data_ptr() == lm_head.data_ptr()
    assert loaded.config.target_lm_head_fingerprint == lm_head_fingerprint(lm_head)


def test_checkpoint_folder_contents(saved) -> None:
    out, model, _ = saved
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert sorted(p.name for p in out.parent.iterdir()) == ["ckpt"]  # no temp dirs left
    assert (out / "README.md").read_text() == "# tiny clover\n"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "clover" and config["architectures"] == ["CloverModel"]
    assert config["target_vocab_size"] == V and config["target_lm_head_fingerprint"].startswith(
        "v1:"
    )
    with safe_open(out / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert names == set(model.state_dict())
    assert "draft_vocab_ids" in names and not any("lm_head" in n or "embed" in n for n in names)


def test_save_refuses_existing_folder_and_overwrites_atomically(saved) -> None:
    out, model, _ = saved
    with pytest.raises(FileExistsError):
        save_clover(model, model.config, out)
    save_clover(model, model.config, out, overwrite=True)
    assert sorted(p.name for p in out.parent.iterdir()) == ["ckpt"]
    assert not (out / "README.md").exists()


def test_failed_save_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config()
    model, _ = trained_model(cfg)

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module, "save_file", disk_full)
    with pytest.raises(OSError, match="disk full"):
        save_clover(model, cfg, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_save_checks_config_and_fingerprint(tmp_path: Path) -> None:
    model, _ = trained_model(tiny_config())
    with pytest.raises(ValueError, match=r"config does not describe.*\['num_heads'\]"):
        save_clover(model, tiny_config(num_heads=K + 1), tmp_path / "a")
    with pytest.raises(ValueError, match=r"fields differ: \['rope_theta'\]"):
        save_clover(model, tiny_config(rope_theta=1.0), tmp_path / "a")
    save_clover(model, tiny_config(target_name="renamed"), tmp_path / "c")  # identity may differ
    with pytest.raises(CloverCheckpointError, match="fingerprint"):
        save_clover(model, tiny_config(target_lm_head_fingerprint="v1:other"), tmp_path / "b")


# ---------------------------------------------------------------- load errors
def rewrite_weights(path: Path, edit) -> None:
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


def test_error_wrong_hidden_size(saved) -> None:
    out, _, _ = saved
    with pytest.raises(CloverCheckpointError, match=r"hidden size mismatch.*ckpt"):
        load_clover(out, torch.randn(V, D + 8))


def test_error_wrong_vocab(saved) -> None:
    out, _, _ = saved
    with pytest.raises(CloverCheckpointError, match=r"vocab size mismatch.*ckpt"):
        load_clover(out, torch.randn(V + 8, D))


def test_error_wrong_fingerprint(saved) -> None:
    out, _, lm_head = saved
    other = lm_head.clone()
    other[0] += 1.0  # row 0 is always in the fingerprint sample
    with pytest.raises(CloverCheckpointError, match=r"fingerprint mismatch.*ckpt"):
        load_clover(out, other)


@pytest.mark.parametrize(
    ("name", "message"),
    [("config.json", "missing config.json"), ("model.safetensors", "missing model.safetensors")],
)
def test_error_missing_file(saved, name: str, message: str) -> None:
    out, _, lm_head = saved
    (out / name).unlink()
    with pytest.raises(CloverCheckpointError, match=message):
        load_clover(out, lm_head)


def test_error_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CloverCheckpointError, match="not found"):
        load_clover(tmp_path / "nope", torch.randn(V, D))


def test_error_truncated_safetensors(saved) -> None:
    out, _, lm_head = saved
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CloverCheckpointError, match=r"corrupt or truncated.*model.safetensors"):
        load_clover(out, lm_head)


def test_error_bad_config(saved) -> None:
    out, _, lm_head = saved
    (out / "config.json").write_text("{not json")
    with pytest.raises(CloverCheckpointError, match="unreadable"):
        load_clover(out, lm_head)
    (out / "config.json").write_text(json.dumps({"model_type": "medusa"}))
    with pytest.raises(CloverCheckpointError, match="model_type must be 'clover'"):
        load_clover(out, lm_head)
    (out / "config.json").write_text(
        json.dumps({"model_type": "clover", "hidden_size": D, "num_heads": 0})
    )
    with pytest.raises(CloverCheckpointError, match="num_heads must be >= 1"):
        load_clover(out, lm_head)


def test_error_missing_weight(saved) -> None:
    out, _, lm_head = saved
    rewrite_weights(out, lambda s: s.pop("decoder.q_proj.weight"))
    with pytest.raises(CloverCheckpointError, match=r"missing weights \['decoder.q_proj.weight'\]"):
        load_clover(out, lm_head)


def test_error_unexpected_weight(saved) -> None:
    out, _, lm_head = saved
    rewrite_weights(out, lambda s: s.update({"lm_head.weight": torch.zeros(V, D)}))
    with pytest.raises(CloverCheckpointError, match=r"unexpected weights \['lm_head.weight'\]"):
        load_clover(out, lm_head)


def test_error_shape_mismatch(saved) -> None:
    out, _, lm_head = saved
    rewrite_weights(out, lambda s: s.update({"blocks.1.layers.0.bias": torch.zeros(D + 1)}))
    with pytest.raises(CloverCheckpointError, match=r"shape mismatch: blocks.1.layers.0.bias"):
        load_clover(out, lm_head)


def test_error_bad_draft_vocab(saved) -> None:
    out, _, lm_head = saved
    rewrite_weights(
        out, lambda s: s.update({"draft_vocab_ids": s["draft_vocab_ids"].flip(0).contiguous()})
    )
    with pytest.raises(CloverCheckpointError, match="sorted"):
        load_clover(out, lm_head)


# ---------------------------------------------------------------- fingerprint
def test_fingerprint_is_dtype_robust_and_sensitive() -> None:
    weight = torch.randn(V, D) * 0.02
    weight[5, :4] = torch.tensor([1e-6, -1e-6, 0.0, -0.0])  # tiny values and signed zero
    bf16 = weight.to(torch.bfloat16)
    reference = lm_head_fingerprint(weight)
    assert reference.startswith(f"v1:{V}x{D}:")
    for variant in (bf16, bf16.float(), bf16.half(), bf16.double()):
        assert lm_head_fingerprint(variant) == reference
    changed = weight.clone()
    changed[0, 0] += 0.01
    assert lm_head_fingerprint(changed) != reference
    assert lm_head_fingerprint(weight[:-1]) != reference


# ---------------------------------------------------------------- Medusa export
def test_export_medusa_refuses_clover_components(tmp_path: Path) -> None:
    for flag in ("use_augmenting_block", "use_attention_decoder", "use_regressive_connection"):
        flags = dict(
            use_augmenting_block=False, use_attention_decoder=False, use_regressive_connection=False
        )
        cfg = tiny_config(**{**flags, flag: True})
        model, lm_head = trained_model(cfg)
        with pytest.raises(ValueError, match="Clover component"):
            export_medusa(model, cfg, tmp_path / flag, lm_head)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("draft_vocab_size", [None, 50])
def test_export_medusa_names_and_shapes(tmp_path: Path, draft_vocab_size: int | None) -> None:
    cfg = CloverConfig.medusa(
        hidden_size=D, vocab_size=V, num_heads=K, draft_vocab_size=draft_vocab_size
    )
    model, lm_head = trained_model(cfg)
    out = export_medusa(model, cfg, tmp_path / "medusa", lm_head)
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
        assert torch.equal(state["token_map"], model.draft_vocab_ids)
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
    cfg = CloverConfig.medusa(
        hidden_size=D, vocab_size=V, num_heads=K, draft_vocab_size=draft_vocab_size
    )
    model, lm_head = trained_model(cfg)
    out = export_medusa(model, cfg, tmp_path / "medusa", lm_head)
    config = vllm_medusa.MedusaConfig.from_pretrained(str(out))
    assert (config.num_heads, config.num_hidden_layers, config.medusa_fc_bias) == (K, 1, True)
    assert config.truncated_vocab_size == (draft_vocab_size or V)
    stand_in = MedusaStandIn(config, vllm_medusa)
    weights = load_file(out / "model.safetensors").items()
    from vllm_clover.integration.patches import apply_patches

    apply_patches()  # as in every vLLM process: the medusa_token_map patch reports token_map
    with torch.no_grad():
        loaded = vllm_medusa.Medusa.load_weights(stand_in, weights)  # vLLM's own loader
    assert loaded == {n for n, _ in stand_in.named_parameters()}
    hidden = torch.randn(6, D)
    with torch.no_grad():
        assert torch.equal(
            stand_in.draft(hidden), model.propose(hidden, torch.zeros(6, dtype=torch.long), K)
        )


def test_save_and_export_in_bf16(tmp_path: Path) -> None:
    """fp32 weights stored as bf16 (half the bytes); the draft vocabulary stays int64."""
    cfg = tiny_config(draft_vocab_size=50)
    model, lm_head = trained_model(cfg)
    save_clover(model, cfg, tmp_path / "ckpt", dtype=torch.bfloat16)
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert {t.dtype for n, t in state.items() if n != "draft_vocab_ids"} == {torch.bfloat16}
    assert torch.equal(state["draft_vocab_ids"], model.draft_vocab_ids)
    loaded = load_clover(tmp_path / "ckpt", lm_head, target_name="tiny-target",
                         dtype=torch.float32)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16).to(tensor.dtype))

    medusa_cfg = CloverConfig.medusa(hidden_size=D, vocab_size=V, num_heads=K, draft_vocab_size=50)
    medusa, _ = trained_model(medusa_cfg)
    out = export_medusa(medusa, medusa_cfg, tmp_path / "medusa", lm_head, dtype=torch.bfloat16)
    exported = load_file(out / "model.safetensors")
    assert exported["lm_heads.0.weight"].dtype == torch.bfloat16
    assert exported["token_map"].dtype == torch.int64
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
