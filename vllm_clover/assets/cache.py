"""Where fetched assets live, and how they are written so that none is ever half there.

The cache root is, in order of precedence: an explicit `--cache-dir`, `$CLOVER_CACHE_DIR`,
`$XDG_CACHE_HOME/vllm-clover`, `~/.cache/vllm-clover`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "CLOVER_CACHE_DIR"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """The cache directory (not created here)."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "vllm-clover"


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a fresh temp dir beside `final`; rename it to `final` only if the block succeeds.

    A crash, an exception or a full disk leaves at most a `.tmp-*` sibling (removed here when
    we can), never a `final` that looks complete. An existing `final` is replaced.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a cache folder should read like any other
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Write `data` to `final` through a temp file and a rename (same guarantee as above)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}-", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
