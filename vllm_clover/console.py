"""Output a person reads: our lines on the terminal, everything else in a log file.

``quiet_output`` points file descriptors 1 and 2 at a log file for a command, since vLLM,
PyTorch and their C++ code write there directly, past Python's logging and warnings filters.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def quiet_output(log: Path | None) -> Iterator[TextIO]:
    """Yield the terminal's stream; meanwhile everything else written to fds 1 and 2 goes to
    `log` (created, its folder too). With `log` None nothing is redirected (``--verbose``)."""
    if log is None:
        yield sys.stdout
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        with open(log, "w") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield terminal
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        terminal.close()
        for fd in saved:
            os.close(fd)
