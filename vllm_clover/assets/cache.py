"""Where fetched assets live (written with `vllm_clover.fsutil`, so none is ever half there).

The cache root is, in order of precedence: an explicit `--cache-dir`, `$CLOVER_CACHE_DIR`,
`$XDG_CACHE_HOME/vllm-clover`, `~/.cache/vllm-clover`.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "CLOVER_CACHE_DIR"
CACHE_HELP = "asset cache (default: $CLOVER_CACHE_DIR, else ~/.cache/vllm-clover)"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """The cache directory (not created here)."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "vllm-clover"
