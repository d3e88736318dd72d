"""The Clover checkpoint format: save, load, validation errors, the LM-head fingerprint, and
checkpoints written before the network was split into its three parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import helpers
from helpers import D, K, V
from vllm_clover.bundled import CLOVER2_HEADS, FULL_CLOVER_HEADS, REFERENCE_HEADS
from vllm_clover.modeling import (
    CloverCheckpointError,
    CloverConfig,
    CloverModel,
    lm_head_fingerprint,
    load_clover,
    save_clover,
    shift_tokens_for_heads,
)
from vllm_clover.modeling import checkpoint as checkpoint_module
from vllm_clover.modeling.checkpoint import read_config_json, set_config_field
from vllm_clover.tree import TokenTree

pytestmark = pytest.mark.unit


def tiny_config(**overrides) -> CloverConfig:
    return helpers.tiny_config(**{"target_name": "tiny-target", **overrides})


def trained_model(
    cfg: CloverConfig, dtype: torch.dtype = torch.float32
) -> tuple[CloverModel, torch.Tensor]:
    """A model with random weights (a draft vocab if configured) and its target LM head."""
    torch.manual_seed(0)
    model = CloverModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if cfg.draft_vocab_size:
        model.tables.set_draft_vocab(torch.randperm(V)[: cfg.draft_vocab_size].sort().values)
    model.to(dtype)
    lm_head = torch.randn(V, D).to(dtype)
    model.attach_target(lm_head)
    return model, lm_head


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, CloverModel, torch.Tensor]:
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
    assert loaded.dtype == dtype and loaded.tables.lm_head_weight.data_ptr() == lm_head.data_ptr()
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
    assert names == set(model.checkpoint_state())
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


def test_save_and_export_in_bf16(tmp_path: Path) -> None:
    """fp32 weights stored as bf16 (half the bytes); the draft vocabulary stays int64."""
    cfg = tiny_config(draft_vocab_size=50)
    model, lm_head = trained_model(cfg)
    save_clover(model, cfg, tmp_path / "ckpt", dtype=torch.bfloat16)
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert {t.dtype for n, t in state.items() if n != "draft_vocab_ids"} == {torch.bfloat16}
    assert torch.equal(state["draft_vocab_ids"], model.tables.draft_vocab_ids)
    loaded = load_clover(tmp_path / "ckpt", lm_head, target_name="tiny-target", dtype=torch.float32)
    for name, tensor in model.checkpoint_state().items():
        assert torch.equal(
            loaded.checkpoint_state()[name], tensor.to(torch.bfloat16).to(tensor.dtype)
        )


# ---------------------------------------------------------------- config reader
def test_read_config_json_is_the_one_reader(saved, tmp_path: Path) -> None:
    out, _, _ = saved
    assert read_config_json(out)["model_type"] == "clover"
    with pytest.raises(CloverCheckpointError, match="model_type must be 'medusa', got 'clover'"):
        read_config_json(out, "medusa")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    with pytest.raises(CloverCheckpointError, match="got 'list'"):
        read_config_json(tmp_path / "list")


# ---------------------------------------------------------------- older checkpoints
@pytest.mark.parametrize(
    "folder", [REFERENCE_HEADS, FULL_CLOVER_HEADS, CLOVER2_HEADS], ids=lambda p: p.name
)
def test_checkpoints_written_by_the_single_module_network_load(
    folder: Path, reference_target, tmp_path: Path
) -> None:
    """The bundled heads are stored in format version 1, the flat names of the single-module
    network (-clover-full was written before the network was split into Augmenting Block,
    head loop and tables): they load, draft, and save back to the same names and tensors."""
    lm_head = load_file(reference_target / "model.safetensors")["model.embed_tokens.weight"]
    model = load_clover(folder, lm_head.float(), dtype=torch.float32)
    stored = load_file(folder / "model.safetensors")
    assert set(model.checkpoint_state()) == set(stored)
    assert (model.augmenting is not None) == model.config.use_augmenting_block
    h0 = torch.randn(2, model.config.hidden_size)
    drafts = model.propose(h0, torch.tensor([1, 2]), model.config.num_heads)
    assert set(drafts.flatten().tolist()) <= set(stored["draft_vocab_ids"].tolist())
    again = save_clover(model, model.config, tmp_path / "again", dtype=torch.bfloat16)
    resaved = load_file(again / "model.safetensors")
    assert all(torch.equal(resaved[n], t) for n, t in stored.items())


def test_set_config_field_keeps_the_other_fields_and_refuses_a_tree_too_deep(tmp_path):
    heads = tmp_path / "heads"
    shutil.copytree(REFERENCE_HEADS, heads)
    before = json.loads((heads / "config.json").read_text())
    set_config_field(heads, "token_tree", "[(0,), (1,), (0, 0)]")
    after = json.loads((heads / "config.json").read_text())
    assert after == {**before, "token_tree": "[(0,), (1,), (0, 0)]"}
    too_deep = str(TokenTree.from_paths([(0,) * k for k in range(1, before["num_heads"] + 2)]))
    with pytest.raises(ValueError, match="token_tree"):
        set_config_field(heads, "token_tree", too_deep)
    assert json.loads((heads / "config.json").read_text()) == after  # untouched
