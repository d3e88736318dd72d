"""The `cpu_malloc` patch: keep freed large buffers in the heap of a vLLM process on CPU.

A speculative step allocates several fresh [tokens, vocab] float32 tensors: the logits of
every verified position, and the rejection sampler's copies of them (a batch of 64 requests
with 4 drafts: 320 x 49,152 x 4 bytes = 63 MB each). glibc's malloc serves an allocation this
large with a fresh `mmap` and unmaps it on free, so every step page-faults in tens of MB of
zeroed memory, which made the rejection sampler a large share of a step under load (the step
profile in docs/history/benchmarks-2026-11.md). vLLM's CPU guide answers it with tcmalloc,
which a pip install does not have; glibc's own tunables do the same for large blocks:

    M_MMAP_MAX = 0             large blocks come from the heap, not from fresh mappings
    M_TRIM_THRESHOLD = 2 GiB   freed heap memory is kept for the next step, not returned

Every process vLLM starts on CPU gets it (vanilla engines too, so comparisons stay fair).
CLOVER_SKIP_FIXES=cpu_malloc leaves malloc as it is; so does a C library without `mallopt`.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h> parameter numbers
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: the largest, about 2 GiB
_applied: list[bool] = []  # once per process


def malloc_settings() -> dict[int, int]:
    """{mallopt parameter: value} this patch sets."""
    return {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: TRIM_THRESHOLD}


def patch_cpu_malloc() -> None:
    """Apply `malloc_settings` on the CPU platform, once per process (see the docstring)."""
    if _applied:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    _applied.append(set_mallopt(malloc_settings()))


def set_mallopt(settings: dict[int, int]) -> bool:
    """Call the C library's mallopt for each setting; False where there is none (not glibc)
    or a setting is refused."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in settings.items())
