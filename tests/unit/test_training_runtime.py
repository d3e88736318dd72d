"""training/runtime.py: freed heap goes back to the system."""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch

from vllm_clover.training.runtime import current_memory_bytes, return_freed_memory

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="the C library is not glibc"
)
def test_freed_tensors_go_back_to_the_system():
    """Tensors of 0.5-2 MB between small ones left alive, as a cache fill allocates them:
    freed and collected, glibc keeps their ~400 MB; return_freed_memory hands them back."""
    return_freed_memory()
    before = current_memory_bytes(CPU)
    lift = torch.ones(1 << 22)  # freed, a 16 MB block lifts glibc's mmap threshold above
    del lift  # the tensors below, so they come from the heap
    sizes = torch.randint(1 << 17, 1 << 19, (300,), generator=torch.Generator().manual_seed(0))
    large, small = [], []
    for n in sizes.tolist():
        large.append(torch.ones(n))
        small.append(torch.ones(16))
    del large
    gc.collect()
    kept = current_memory_bytes(CPU) - before
    return_freed_memory()
    returned = kept - (current_memory_bytes(CPU) - before)
    assert kept > 200e6, f"glibc kept only {kept / 1e6:.0f} MB: nothing to return"
    assert returned > 0.9 * kept, (kept, returned)
