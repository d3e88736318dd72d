"""What the ledger records of a vLLM internal: where it is ("module:qualified.name"), and a
fingerprint of its source (docs/design/engine-layer.md, "Fingerprints")."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Any


def resolve(target: str) -> Any:
    """The object a "module:qualified.name" target names (AttributeError/ImportError if gone)."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def fingerprint(target: str) -> str:
    """12 hex digits of sha256 over the target's source (or repr, for plain values)."""
    obj = resolve(target)
    if inspect.isroutine(obj) or inspect.isclass(obj):
        text = inspect.getsource(inspect.unwrap(obj))
    else:
        text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stale_targets() -> list[tuple[str, str, str, str]]:
    """(entry, target, recorded, installed) for every ledger target whose source changed;
    installed is "missing: ..." when the target no longer exists."""
    from vllm_clover.patches import LEDGER

    stale = []
    for entry in LEDGER:
        for target, recorded in entry.targets.items():
            try:
                installed = fingerprint(target)
            except (AttributeError, ImportError, OSError, TypeError) as err:
                installed = f"missing: {err}"
            if installed != recorded:
                stale.append((entry.name, target, recorded, installed))
    return stale


if __name__ == "__main__":  # after a vLLM upgrade: what to re-read, and the new fingerprints
    for name, target, recorded, installed in stale_targets():
        print(f"{name:22} {target}\n{'':22} recorded {recorded}, installed {installed}")
