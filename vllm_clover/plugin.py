"""vLLM plugin entry point (`vllm.general_plugins` -> `clover`). vLLM calls `register()` in
every process, maybe more than once, so it is idempotent and cheap: no model weights, never
numba (docs/design/engine-layer.md, "The commands")."""

from __future__ import annotations

import multiprocessing
import os

from vllm.logger import init_logger

from vllm_clover import __version__
from vllm_clover.compat import check_vllm_version

# A child of vLLM's "vllm" logger, so our lines carry vLLM's format and process prefix.
logger = init_logger("vllm.clover")


def register() -> None:
    """Activate vllm-clover in this vLLM process; UnsupportedVLLMError (vLLM then stops) on a
    vLLM release other than the pinned one."""
    vllm_version = check_vllm_version()
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from vllm_clover.modeling.config import CLOVER_ARCHITECTURE, CloverConfig
    from vllm_clover.patches import apply_patches

    apply_patches()
    AutoConfig.register("clover", CloverConfig, exist_ok=True)
    if CLOVER_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(CLOVER_ARCHITECTURE, "vllm_clover.core.model:CloverDraftModel")
    logger.info(
        "vllm-clover %s active (vLLM %s, process %s, pid %d)",
        __version__,
        vllm_version,
        multiprocessing.current_process().name,
        os.getpid(),
    )
