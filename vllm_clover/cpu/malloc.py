"""Keep freed large buffers in the process heap (glibc's ``mallopt``), for CPU processes that
allocate and free the same large tensors at every step: vLLM engines (``cpu_malloc``) and the
trainers. Why: docs/design/engine-layer.md, "Large blocks kept in the heap"."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h> parameter numbers
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: the largest, about 2 GiB


def malloc_settings() -> dict[int, int]:
    """{mallopt parameter: value} that keep large blocks in the heap."""
    return {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: TRIM_THRESHOLD}


@functools.cache
def libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name`` (looked up once per process), or None without it."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None


def set_mallopt(settings: dict[int, int]) -> bool:
    """Call the C library's mallopt for each setting; False where there is none (not glibc)
    or a setting is refused."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in settings.items())


def keep_large_blocks() -> bool:
    """Apply `malloc_settings` to this process; False where the C library has no mallopt."""
    return set_mallopt(malloc_settings())


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``, which also
    releases whole free pages inside the heap); False where the C library has none."""
    trim = libc_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    trim(0)
    return True
