"""The Clover checkpoint folder: save, read and validate, load; the target LM-head fingerprint.

A Hugging Face-style folder (config.json, model.safetensors, README.md), written to a temporary
sibling and renamed into place, so a folder named ``out_dir`` is always complete. Layout, names
and checks: docs/checkpoint-format.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vllm_clover.fsutil import atomic_directory, atomic_write_bytes
from vllm_clover.modeling.clover import CloverModel
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.tables import check_draft_vocab

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_CARD_NAME = "README.md"
FORMAT_VERSION = "1"


class CloverCheckpointError(ValueError):
    """A Clover checkpoint is missing, corrupt, or does not fit the given target."""


# ---------------------------------------------------------------------- fingerprint
def lm_head_fingerprint(weight: torch.Tensor, num_rows: int = 64) -> str:
    """Cheap, dtype-robust fingerprint of a target LM head weight (V, D): "v1:{V}x{D}:{hex}".

    The same weights give the same string in float32, bfloat16 or (any bf16 checkpoint) float16,
    on any device. Pass the unpadded weight (slice off vLLM's vocab padding first). The recipe:
    docs/checkpoint-format.md, "LM-head fingerprint"."""
    if weight.dim() != 2:
        raise ValueError(
            f"lm_head weight must be 2-D (vocab, hidden), got shape {tuple(weight.shape)}"
        )
    vocab, hidden = weight.shape
    stride = max(1, vocab // num_rows)
    rows = torch.arange(0, vocab, stride, device=weight.device)[:num_rows]
    sample = weight.detach().index_select(0, rows).cpu().float()  # (num_rows, D)
    sample = sample.to(torch.bfloat16).float()
    sample = torch.where(sample.abs() < 2.0**-14, torch.zeros_like(sample), sample)
    digest = hashlib.sha256(f"{vocab}x{hidden}:".encode())
    digest.update(sample.contiguous().numpy().tobytes())
    return f"v1:{vocab}x{hidden}:{digest.hexdigest()[:32]}"


# ---------------------------------------------------------------------- save
def save_clover(
    model: CloverModel,
    config: CloverConfig,
    out_dir: str | os.PathLike,
    model_card: str | None = None,
    *,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``README.md``) atomically to out_dir.

    ``config`` must describe the same architecture as ``model``. An attached LM head's
    fingerprint is recorded (it must equal one already set in ``config``). ``dtype``: store
    the float weights in it (e.g. bfloat16). Returns the folder path."""
    config = copy.deepcopy(config)
    check_same_architecture(model, config)
    if model.tables.lm_head_weight is not None:
        fingerprint = lm_head_fingerprint(model.tables.lm_head_weight)
        recorded = config.target_lm_head_fingerprint
        if recorded and recorded != fingerprint:
            raise CloverCheckpointError(
                f"refusing to save to {out_dir}: config.target_lm_head_fingerprint={recorded} "
                f"but the attached LM head has fingerprint {fingerprint}"
            )
        config.target_lm_head_fingerprint = fingerprint
    state = {name: stored_tensor(t, dtype) for name, t in model.checkpoint_state().items()}

    with atomic_directory(Path(out_dir), overwrite=overwrite) as tmp:
        config.to_json_file(tmp / CONFIG_NAME, use_diff=False)
        metadata = {"format": "pt", "clover_format_version": FORMAT_VERSION}
        save_file(state, tmp / WEIGHTS_NAME, metadata=metadata)
        if model_card is not None:
            (tmp / MODEL_CARD_NAME).write_text(model_card, encoding="utf-8")
    return Path(out_dir)


def stored_tensor(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A CPU copy to save: float tensors in ``dtype`` (if given), others unchanged."""
    tensor = tensor.detach().cpu()
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    return tensor.contiguous()


def check_same_architecture(model: CloverModel, config: CloverConfig) -> None:
    """``config`` must equal ``model.config`` except for the target-identity fields."""

    def architecture(cfg: CloverConfig) -> dict[str, object]:
        skip = (
            "target_name",
            "target_lm_head_fingerprint",
            "target_num_hidden_layers",
            "_name_or_path",
            "transformers_version",
        )
        return {k: v for k, v in cfg.to_dict().items() if k not in skip}

    ours, theirs = architecture(config), architecture(model.config)
    if ours != theirs:
        diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        raise ValueError(f"config does not describe this model; fields differ: {diff}")


def _expected_shapes(config: CloverConfig) -> dict[str, tuple[int, ...]]:
    """Weight names -> shapes a model built from ``config`` has (built on the meta device)."""
    with torch.device("meta"):
        reference = CloverModel(config)
    return {name: tuple(t.shape) for name, t in reference.checkpoint_state().items()}


# ---------------------------------------------------------------------- load
def read_config_json(path: str | os.PathLike, model_type: str | None = "clover") -> dict:
    """``path/config.json`` of a checkpoint folder as a dict, if its model_type matches (any
    with None): the one reader of checkpoint configs (Clover's, the bench's Medusa folders).
    CloverCheckpointError names the problem: no folder, no or unreadable config.json, or a
    checkpoint of another kind."""
    folder = Path(path)
    config_file = folder / CONFIG_NAME
    if not folder.is_dir():
        raise CloverCheckpointError(f"checkpoint folder not found: {path}")
    if not config_file.is_file():
        raise CloverCheckpointError(f"missing {CONFIG_NAME} in checkpoint {path}")
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CloverCheckpointError(f"unreadable {config_file}: {err}") from err
    found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
    if model_type is not None and found != model_type:
        raise CloverCheckpointError(
            f"{config_file}: model_type must be {model_type!r}, got {found!r}"
        )
    return raw


def set_config_field(path: str | os.PathLike, name: str, value: Any) -> None:
    """Write one field (``draft_confidence``, ``token_tree``) into a Clover checkpoint's
    config.json, every other field kept as it is; validated like a loaded config first,
    written atomically (CloverCheckpointError, the file untouched, if it does not validate)."""
    raw = read_config_json(path)
    raw[name] = value
    try:
        CloverConfig.from_dict(raw)
    except (TypeError, ValueError) as err:
        raise CloverCheckpointError(f"{path}: cannot set {name}: {err}") from err
    text = json.dumps(raw, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(Path(path) / CONFIG_NAME, text.encode())


def load_clover_config(path: str | os.PathLike) -> CloverConfig:
    """Read and validate ``path/config.json``; CloverCheckpointError on any problem."""
    raw = read_config_json(path, CloverConfig.model_type)
    try:
        return CloverConfig.from_dict(raw)
    except (TypeError, ValueError) as err:
        raise CloverCheckpointError(
            f"invalid Clover config {Path(path) / CONFIG_NAME}: {err}"
        ) from err


def load_clover(
    path: str | os.PathLike,
    lm_head_weight: torch.Tensor,
    target_name: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> CloverModel:
    """Load a Clover checkpoint for the target whose LM head weight (V, D) is given.

    Validates the folder, weights, names, shapes and the target's fit (hidden size, vocab,
    LM-head fingerprint): CloverCheckpointError naming the problem and the path. ``dtype``
    defaults to the stored dtype, ``device`` to the LM head's; a differing ``target_name``
    only warns (the fingerprint decides)."""
    config = load_clover_config(path)
    check_target_fits(config, path, lm_head_weight, target_name)
    state = _read_weights(Path(path) / WEIGHTS_NAME)
    _check_weight_names(config, state, path)
    with torch.device("meta"):
        model = CloverModel(config)
    model.load_checkpoint_state(state, assign=True)
    ids = model.tables.draft_vocab_ids
    try:
        if ids is not None:
            check_draft_vocab(ids, config.draft_vocab_size, config.vocab_size)
        stored = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
        model.to(device=device or lm_head_weight.device, dtype=dtype or stored)
        model.attach_target(lm_head_weight)
    except ValueError as err:
        raise CloverCheckpointError(f"{path}: {err}") from err
    return model


def validate_checkpoint(path: str | os.PathLike) -> CloverConfig:
    """Check a checkpoint folder on its own (config, weights file, names, shapes); no target.

    Returns its config; CloverCheckpointError naming the problem otherwise. The vLLM layer
    calls it at start-up, before any worker (and any target weight) exists."""
    return read_clover(path)[0]


def read_clover(path: str | os.PathLike) -> tuple[CloverConfig, dict[str, torch.Tensor]]:
    """A checkpoint's config and flat tensors, validated on their own (no target), on CPU."""
    config = load_clover_config(path)
    state = _read_weights(Path(path) / WEIGHTS_NAME)
    _check_weight_names(config, state, path)
    return config, state


def check_target_fits(
    config: CloverConfig,
    path: str | os.PathLike,
    lm_head_weight: torch.Tensor,
    target_name: str | None = None,
) -> None:
    """The target's LM head fits the checkpoint: hidden size, vocab, fingerprint."""
    if lm_head_weight.dim() != 2:
        raise CloverCheckpointError(
            f"{path}: lm_head_weight must be (vocab, hidden), got {tuple(lm_head_weight.shape)}"
        )
    vocab, hidden = lm_head_weight.shape
    check_target_shape(config, path, hidden, vocab, " (slice off any vocab padding before loading)")
    _check_target_identity(config, path, lm_head_weight, target_name)


def check_target_shape(
    config: CloverConfig, path: str | os.PathLike, hidden_size: int, vocab_size: int, hint: str = ""
) -> None:
    """The target's hidden size and vocabulary are the ones the heads were trained for."""
    for what, trained, actual in (
        ("hidden size", config.hidden_size, hidden_size),
        ("vocab size", config.vocab_size, vocab_size),
    ):
        if trained != actual:
            raise CloverCheckpointError(
                f"{what} mismatch: Clover checkpoint {path} was trained for "
                f"{what.replace(' ', '_')}={trained} (target {config.target_name!r}), "
                f"the target has {actual}{hint}"
            )


def _check_target_identity(
    config: CloverConfig,
    path: str | os.PathLike,
    lm_head_weight: torch.Tensor,
    target_name: str | None,
) -> None:
    """LM-head fingerprint must match (error); a different target name only warns."""
    recorded = config.target_lm_head_fingerprint
    if recorded and recorded != (actual := lm_head_fingerprint(lm_head_weight)):
        raise CloverCheckpointError(
            f"LM-head fingerprint mismatch: checkpoint {path} was trained for target "
            f"{config.target_name!r} with fingerprint {recorded}, the given LM head has {actual}"
        )
    if not recorded:
        warnings.warn(
            f"{path}: no target_lm_head_fingerprint recorded; target identity not checked",
            stacklevel=3,
        )
    if target_name and config.target_name and target_name != config.target_name:
        warnings.warn(
            f"{path}: trained for target {config.target_name!r}, loading for {target_name!r}",
            stacklevel=3,
        )


def _read_weights(weights_file: Path) -> dict[str, torch.Tensor]:
    if not weights_file.is_file():
        raise CloverCheckpointError(
            f"missing {WEIGHTS_NAME} in Clover checkpoint {weights_file.parent}"
        )
    try:
        with safe_open(weights_file, framework="pt") as f:
            version = (f.metadata() or {}).get("clover_format_version", FORMAT_VERSION)
            state = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise CloverCheckpointError(
            f"corrupt or truncated safetensors file {weights_file}: {err}"
        ) from err
    if version != FORMAT_VERSION:
        raise CloverCheckpointError(
            f"{weights_file}: unsupported clover_format_version {version!r}"
        )
    return state


def _check_weight_names(
    config: CloverConfig, state: dict[str, torch.Tensor], path: str | os.PathLike
) -> None:
    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CloverCheckpointError(f"{path}: missing weights {missing} (config expects them)")
    if unexpected:
        raise CloverCheckpointError(f"{path}: unexpected weights {unexpected} (not in this config)")
    bad = [
        f"{n}: stored {tuple(state[n].shape)} != expected {s}"
        for n, s in expected.items()
        if tuple(state[n].shape) != s
    ]
    if bad:
        raise CloverCheckpointError(f"{path}: weight shape mismatch: {'; '.join(bad)}")
