"""Start-up validation of `speculative_config={"method": "clover", "model": DIR, ...}`.

Runs in the process that builds the engine config (API server / `LLM(...)`), before any
worker starts, so a bad checkpoint fails with a message that names the problem instead of
an engine-core crash. Only the LM-head fingerprint needs the target's weights; the worker
checks it when it attaches them (`CloverProposer._maybe_share_lm_head`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from vllm.platforms import current_platform

from vllm_clover.modeling.checkpoint import CONFIG_NAME, CloverCheckpointError, validate_checkpoint
from vllm_clover.modeling.config import CloverConfig

CLOVER_MODEL_TYPE = "clover"
DRAFT_DTYPE_ENV = "CLOVER_DRAFT_DTYPE"  # drafts' scoring dtype, see model.scoring_dtype
DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int8": torch.int8}
DRAFT_DTYPE_CHOICES = ("auto", *DRAFT_DTYPES)
# vLLM routes draft paths containing these substrings to other methods (config/speculative.py).
ROUTED_PATH_SUBSTRINGS = ("eagle-", "eagle3", "dflash", "dspark")


def is_clover_checkpoint(model: str | None) -> bool:
    """True if `model` is a local folder whose config.json says model_type "clover"."""
    if not model or not os.path.isdir(model):
        return False
    try:
        config = json.loads((Path(model) / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") == CLOVER_MODEL_TYPE


def draft_dtype_setting() -> str:
    """$CLOVER_DRAFT_DTYPE (default "auto"), or a ValueError naming the allowed values."""
    setting = os.environ.get(DRAFT_DTYPE_ENV, "auto")
    if setting not in DRAFT_DTYPE_CHOICES:
        raise ValueError(f"{DRAFT_DTYPE_ENV}={setting!r} is not one of "
                         f"{', '.join(DRAFT_DTYPE_CHOICES)}")
    return setting


def check_draft_dtype_fits(setting: str, device_type: str) -> None:
    """ValueError for int8 draft scoring (CPU int8 matmuls) on any device but the CPU."""
    if setting == "int8" and device_type != "cpu":
        raise ValueError(f"{DRAFT_DTYPE_ENV}=int8 scores draft rows with CPU int8 matmuls; "
                         f"this is a {device_type} install: unset it (auto)")


def check_clover_spec(
    model: str | None, num_speculative_tokens: int | None, target_hf_config
) -> CloverConfig:
    """Validate a Clover draft folder against the target and K; return its config.

    Raises CloverCheckpointError (a ValueError) naming the problem: not a local folder,
    missing/corrupt config or weights, wrong weight names or shapes, hidden size or vocab
    of another target, K larger than the trained heads.
    """
    check_draft_dtype_fits(draft_dtype_setting(), current_platform.device_type)
    if not model:
        raise CloverCheckpointError('speculative_config method "clover" needs "model": '
                                    "the folder of a Clover checkpoint")
    if not os.path.isdir(model):
        raise CloverCheckpointError(f"Clover checkpoint {model!r} is not a local folder")
    if any(s in model.lower() for s in ROUTED_PATH_SUBSTRINGS):
        raise CloverCheckpointError(
            f"Clover checkpoint path {model!r} contains one of {ROUTED_PATH_SUBSTRINGS}, which "
            "vLLM 0.32 routes to another speculative method; rename the folder")
    config = validate_checkpoint(model)
    target_hidden = target_hf_config.hidden_size
    target_vocab = target_hf_config.vocab_size
    if config.hidden_size != target_hidden:
        raise CloverCheckpointError(
            f"hidden size mismatch: Clover checkpoint {model} was trained for hidden_size="
            f"{config.hidden_size} (target {config.target_name!r}), the target has {target_hidden}")
    if config.vocab_size != target_vocab:
        raise CloverCheckpointError(
            f"vocab size mismatch: Clover checkpoint {model} was trained for vocab_size="
            f"{config.vocab_size} (target {config.target_name!r}), the target has {target_vocab}")
    if num_speculative_tokens is not None and num_speculative_tokens > config.num_heads:
        raise CloverCheckpointError(
            f"num_speculative_tokens={num_speculative_tokens} but Clover checkpoint {model} "
            f"has {config.num_heads} trained heads (use at most {config.num_heads})")
    return config
