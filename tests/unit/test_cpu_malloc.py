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


# A 64 MB hole below a small live block (the heap's top): kept with the settings above, handed
# back by trim_heap. Prints the resident anonymous MB before and after the trim.
HOLE = """
import ctypes, ctypes.util
from vllm_clover.cpu import malloc
assert malloc.keep_large_blocks()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def anon_mb():
    line = next(x for x in open("/proc/self/status") if x.startswith("RssAnon:"))
    return int(line.split()[1]) // 1024
hole = libc.malloc(SIZE)
ctypes.memset(hole, 1, SIZE)
top = libc.malloc(1 << 20)
ctypes.memset(top, 1, 1 << 20)
libc.free(hole)
before = anon_mb()
assert malloc.trim_heap()
print(before, anon_mb())
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")
def test_trim_heap_hands_back_a_hole_inside_the_heap():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = HOLE.replace("SIZE", str(SIZE))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    before, after = map(int, out.stdout.split())
    assert before - after > 48  # most of the 64 MB hole's pages went back


def test_trainers_trim_every_few_steps_on_cpu_only(monkeypatch):
    import torch

    from vllm_clover.training import runtime

    trims = []
    monkeypatch.setattr(runtime, "trim_heap", lambda: trims.append(1))
    every = runtime.HEAP_TRIM_EVERY
    for step in range(1, 2 * every + 1):
        runtime.trim_heap_after(step, torch.device("cpu"))
        runtime.trim_heap_after(step, torch.device("cuda"))
    assert len(trims) == 2
