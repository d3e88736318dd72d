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
    """True if `obj`, or any function it wraps (`__wrapped__`, as functools.wraps sets it), is
    tagged by the patch `name`: a method several patches wrap carries each one's mark down its
    chain, and only the outermost is visible on the class."""
    while obj is not None:
        if getattr(obj, MARKER, None) == name:
            return True
        obj = getattr(obj, "__wrapped__", None)
    return False
