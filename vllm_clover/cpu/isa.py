"""What this CPU multiplies in hardware, read once from /proc/cpuinfo (no vLLM, no torch ops);
``CLOVER_CPU_FLAGS`` forces the flags. The families: docs/design/engine-layer.md, "CPU
families"."""

from __future__ import annotations

import functools
import os
from pathlib import Path

FLAGS_ENV = "CLOVER_CPU_FLAGS"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags ($CLOVER_CPU_FLAGS, else the "flags" line of /proc/cpuinfo);
    empty where unknown."""
    forced = os.environ.get(FLAGS_ENV)
    if forced is not None:
        return frozenset(forced.split())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def cpu_model() -> str:
    """The "model name" of /proc/cpuinfo (e.g. "AMD EPYC"), or "unknown CPU"."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    line = next((x for x in text.splitlines() if x.startswith("model name")), "")
    return line.partition(":")[2].strip() or "unknown CPU"


def isa_family(flags: frozenset[str]) -> str:
    """The CPU family: "AMX", "AVX512-BF16", "AVX-512", "AVX2" or "pre-AVX2".
    Example: {"avx2", "fma"} -> "AVX2"."""
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "pre-AVX2"
