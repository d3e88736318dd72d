"""Resumable training state in ``<out>.train-state/`` (state.pt, trainer.json), kept apart
from the final Clover checkpoint and written with ``atomic_directory``: a crash while saving
leaves the previous state intact. Layout: docs/design/training-internals.md, "Resumable state".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from vllm_clover.fsutil import atomic_directory
from vllm_clover.training.config import RUN_ONLY_FIELDS, TrainConfig, TrainingError
from vllm_clover.training.runtime import rng_state

STATE_FILE = "state.pt"
INFO_FILE = "trainer.json"


def save_state(
    folder: str | Path,
    cfg: TrainConfig,
    modules: dict[str, Any],
    step: int,
    tokens_seen: int,
    total_steps: int,
    planned_steps: int,
) -> None:
    """modules: {"model": heads, "optimizer": ..., "scheduler": ...} (anything with state_dict).
    ``total_steps`` is the plan's length, ``planned_steps`` what it was before --time-budget
    cut it (equal without a cut)."""
    payload = {name: m.state_dict() for name, m in modules.items()}
    payload.update(step=step, tokens_seen=tokens_seen, rng=rng_state())
    info = {
        "step": step,
        "total_steps": total_steps,
        "planned_steps": planned_steps,
        "tokens_seen": tokens_seen,
        "config": dataclasses.asdict(cfg),
    }
    try:
        with atomic_directory(Path(folder), overwrite=True) as tmp:
            torch.save(payload, tmp / STATE_FILE)
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    except OSError as err:
        raise TrainingError(f"could not save training state to {folder}: {err}") from err


def load_state(folder: str | Path, cfg: TrainConfig) -> dict[str, Any]:
    """Read a state folder; TrainingError if missing, corrupt, or from an incompatible config."""
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file() or not (folder / INFO_FILE).is_file():
        raise TrainingError(
            f"no training state to resume in {folder} (expected {STATE_FILE} and {INFO_FILE})"
        )
    try:
        info = json.loads((folder / INFO_FILE).read_text())
        payload = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
    except (OSError, json.JSONDecodeError, RuntimeError, EOFError) as err:
        raise TrainingError(f"corrupt training state in {folder}: {err}") from err
    ours = dataclasses.asdict(cfg)
    differ = sorted(
        k
        for k, v in info.get("config", {}).items()
        if k not in RUN_ONLY_FIELDS and ours.get(k) != v
    )
    if differ:
        raise TrainingError(
            f"cannot resume from {folder}: these settings differ from the saved "
            f"run: {', '.join(differ)}"
        )
    payload["total_steps"] = info["total_steps"]
    payload["planned_steps"] = info.get("planned_steps", info["total_steps"])
    return payload
