"""A ledger entry, and the vLLM module paths its targets are written against.

The entries are `patches/ledger.py` (patches) and `patches/reliances.py` (what the plugin
overrides, relies on or hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

READ_FROM = "0.32.0"  # the vLLM release every fingerprint in the ledger was read from

SPEC = "vllm.config.speculative"
BASE = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
LLAMA = "vllm.model_executor.models.llama"
LAYERS = "vllm.model_executor.layers"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
KV_MANAGER = "vllm.v1.core.kv_cache_manager:KVCacheManager"
CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
EAGLE3 = "vllm.model_executor.models.llama_eagle3"


@dataclass(frozen=True)
class Entry:
    """One place vllm-clover touches vLLM internals."""

    name: str
    kind: str  # "patch" | "override" | "relies" | "hook"
    reason: str
    used_by: str  # our module that touches it
    targets: dict[str, str]  # "module:qualified.name" -> fingerprint of its source
    attributes: tuple[str, ...] = ()  # instance attributes read or written (not methods)
    apply: Callable[[], None] | None = field(default=None, compare=False)
    # A fix that changes every engine the plugin is loaded in (vanilla ones too), not only
    # those that speculate with Clover; $CLOVER_SKIP_FIXES names the ones not to apply.
    every_engine: bool = False
