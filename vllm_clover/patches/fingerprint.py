"""What the ledger records of a vLLM internal: where it is, and a fingerprint of its source.

A target is written "module:qualified.name", e.g.
"vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.set_inputs_first_pass". Its
fingerprint is the first 12 hex digits of the sha256 of its source text (functions, methods,
classes; a patch's wrapper is looked through to the original) or of its repr (values such as
a `Literal` of method names). Any edit to the code we patch or rely on changes it, which is
what the ledger test checks against the installed vLLM.
"""

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
