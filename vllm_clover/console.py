"""Output a person reads: our lines on the terminal, everything else in a log file.

vLLM, PyTorch and their C++ code write start-up notices, progress bars and warnings straight
to the process's stdout and stderr (file descriptors 1 and 2), which Python's logging and
warnings filters cannot hold back. ``quiet_output`` points both descriptors at a log file for
the length of a command (child processes inherit them) and hands the command a stream to the
terminal for its own lines.
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
