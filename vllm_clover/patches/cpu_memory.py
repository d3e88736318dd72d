"""The `cpu_malloc` patch: keep freed large buffers in the heap of every vLLM process on CPU
(vanilla engines too). Why: docs/design/engine-layer.md, "Fixes of vLLM behaviour"."""

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
