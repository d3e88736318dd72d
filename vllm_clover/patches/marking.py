"""How a patch marks what it patched, so that applying it twice in one process is a no-op."""

from __future__ import annotations

from collections.abc import Callable

CLOVER_METHOD = "clover"
MARKER = "__vllm_clover_patch__"


def mark(function: Callable, name: str) -> Callable:
    """Tag a replacement with the name of the patch that installed it; returns it."""
    setattr(function, MARKER, name)
    return function


def is_patched(obj: object, name: str) -> bool:
    """True if `obj` is (or is tagged by) the patch `name`."""
    return getattr(obj, MARKER, None) == name


def is_patched_in_chain(function: Callable, name: str) -> bool:
    """True if `function` or any function it wraps (`__wrapped__`, as functools.wraps sets
    it) is tagged by the patch `name`: for methods more than one patch wraps."""
    while function is not None:
        if is_patched(function, name):
            return True
        function = getattr(function, "__wrapped__", None)
    return False
