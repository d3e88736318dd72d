"""The patches ledger: every vLLM internal that vllm-clover changes, overrides or relies on.

vLLM has no plugin API for a speculative method that drafts from the target's hidden states,
so each place the plugin reaches into vLLM is one `Entry`, fingerprinted and tested against
the pinned vLLM: patches in `ledger.py`, overrides, reliances and hooks in `reliances.py`.
How it works, and each entry with when it can go: docs/design/engine-layer.md, "The patches
ledger".
"""

from __future__ import annotations

import os

from vllm_clover.patches.entry import Entry
from vllm_clover.patches.ledger import PATCHES
from vllm_clover.patches.reliances import RELIANCES

__all__ = ["LEDGER", "PATCHES", "RELIANCES", "Entry", "apply_patches", "skipped_fixes"]

SKIP_FIXES_ENV = "CLOVER_SKIP_FIXES"

LEDGER = PATCHES + RELIANCES


def skipped_fixes() -> frozenset[str]:
    """The every-engine fixes named in $CLOVER_SKIP_FIXES (comma-separated; "all": every
    one), which apply_patches leaves out; ValueError for a name that is not one of them."""
    names = {e.name for e in PATCHES if e.every_engine}
    given = {n.strip() for n in os.environ.get(SKIP_FIXES_ENV, "").split(",") if n.strip()}
    if "all" in given:
        return frozenset(names)
    unknown = given - names
    if unknown:
        raise ValueError(
            f"{SKIP_FIXES_ENV}: {', '.join(sorted(unknown))} is not one of the fixes that "
            f"change every engine ({', '.join(sorted(names))}, or all)"
        )
    return frozenset(given)


def apply_patches() -> None:
    """Apply every patch of the ledger (idempotent), naming the one that does not fit;
    the every-engine fixes in $CLOVER_SKIP_FIXES are left out."""
    skipped = skipped_fixes()
    for entry in PATCHES:
        if entry.name in skipped:
            continue
        try:
            entry.apply()
        except (AttributeError, ImportError, KeyError) as err:
            raise RuntimeError(
                f"vllm-clover patch {entry.name!r} ({entry.reason}) does not "
                f"fit the installed vLLM: {err}"
            ) from err
