"""Freed large blocks kept in the heap (cpu/malloc.py)."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not ctypes.util.find_library("c"), reason="no C library to probe"),
]

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64 << 20  # a 64 MB block, far above glibc's mmap threshold
PAGES = SIZE // 4096

# The block, freed and allocated again five times: with mmap allowed glibc unmaps it on free,
# so each allocation is a fresh mapping (page faults); kept in the heap it is reused.
PROBE = """
import ctypes, ctypes.util, resource, sys
SETUP
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def touch():
    block = libc.malloc(SIZE)
    ctypes.memset(block, 1, SIZE)
    libc.free(block)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(setup: str) -> int:
    """Minor page faults of five 64 MB allocations after `setup` ran in a fresh process."""
    code = PROBE.replace("SETUP", setup).replace("SIZE", str(SIZE))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout.split()[-1])


def test_freed_large_blocks_are_reused_instead_of_mapped_afresh():
    assert page_faults("pass") > 4 * PAGES  # 5 fresh mappings of 16k pages each
    kept = "from vllm_clover.cpu import malloc; assert malloc.keep_large_blocks()"
    assert page_faults(kept) < PAGES // 10  # the same memory, already faulted in


def test_the_trainers_keep_large_blocks_on_cpu_only_there():
    from_runtime = "from vllm_clover.training.runtime import init_runtime; init_runtime('{}')"
    assert page_faults(from_runtime.format("cpu")) < PAGES // 10
    assert page_faults("import vllm_clover.training.runtime") > 4 * PAGES
