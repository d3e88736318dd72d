"""Training and offline evaluation of Clover heads (pure PyTorch + transformers; no vLLM).

``train(TrainConfig(target=..., out=...))`` runs one job (docs/training.md). Only
``generate_data`` imports vLLM, lazily; ``train`` / ``TrainResult`` load torch on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_clover.training.config import TrainConfig, TrainingError

_LAZY = {"train": "vllm_clover.training.trainer", "TrainResult": "vllm_clover.training.trainer"}
__all__ = ["TrainConfig", "TrainResult", "TrainingError", "train"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm_clover.training' has no attribute {name!r}")
