"""Writing folders and files so that none is ever seen half-written (stdlib only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_directory(final: Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh temp dir beside `final`; it becomes `final` only if the block succeeds.

    A crash, an exception or a full disk leaves at most a `.name.tmp-*` sibling (removed
    here when we can), never a `final` that looks complete. An existing `final` is replaced
    (moved aside, swapped, then deleted) or, with overwrite=False, refused up front.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite=True to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a cache folder should read like any other
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Write `data` to `final` through a temp file and a rename (same guarantee as above)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
