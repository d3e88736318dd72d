"""The `cpu_malloc` patch: keep freed large buffers in the heap of a vLLM process on CPU.

A speculative step allocates several fresh [tokens, vocab] float32 tensors: the logits of
every verified position, and the rejection sampler's copies of them (a batch of 64 requests
with 4 drafts: 320 x 49,152 x 4 bytes = 63 MB each). glibc would map and unmap each of them
at every step, which made the rejection sampler a large share of a step under load (the step
profile in docs/history/benchmarks-2026-11.md). vLLM's CPU guide answers it with tcmalloc,
which a pip install does not have; `vllm_clover.cpu.malloc` sets glibc's own tunables instead.

Every process vLLM starts on CPU gets it (vanilla engines too, so comparisons stay fair).
CLOVER_SKIP_FIXES=cpu_malloc leaves malloc as it is; so does a C library without `mallopt`.
"""

from __future__ import annotations

from vllm_clover.cpu import malloc

_applied: list[bool] = []  # once per process


def patch_cpu_malloc() -> None:
    """Keep large blocks in the heap on the CPU platform, once per process (see the docstring)."""
    if _applied:
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    _applied.append(malloc.keep_large_blocks())
