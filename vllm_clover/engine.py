"""Starting vLLM's offline engine with the settings this project uses on CPU."""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import LLM

# vLLM on CPU refuses to start without a KV-cache budget (GiB); plenty for the reference target.
DEFAULT_CPU_KVCACHE_GIB = "2"
# float32: where speculative outputs must equal vanilla ones token for token; enforce_eager:
# a faster engine start, same tokens (docs/design/engine-layer.md, "The commands").
REFERENCE_ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 2048,
    "seed": 0,
}


def set_cpu_env_defaults() -> None:
    """Environment vLLM needs on CPU, unless the user already set it."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)


def start_llm(model: str, **engine_args: Any) -> LLM:
    """`vllm.LLM(model, **REFERENCE_ENGINE_ARGS | engine_args)`. Call under `__main__` guard."""
    set_cpu_env_defaults()
    from vllm import LLM, envs

    # Frozen now, long-lived objects are skipped by the full collections vLLM runs while it
    # loads; only an in-process engine keeps the heap frozen, as vLLM would
    # (docs/design/engine-layer.md, "The commands").
    gc.freeze()
    args = {**REFERENCE_ENGINE_ARGS, **engine_args}
    if "max_model_len" not in engine_args:  # the default, within what the model was made for
        args["max_model_len"] = min(args["max_model_len"], position_limit(model))
    llm = LLM(model=model, **args)
    if envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        gc.unfreeze()
    return llm


def position_limit(model: str) -> int:
    """The target's max_position_embeddings (vLLM refuses a longer max_model_len); a large
    number when its config does not say."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model).get_text_config()
    return getattr(config, "max_position_embeddings", None) or 1 << 30
