"""Our lines on the terminal, everything else in the log (console.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_clover.console import quiet_output

pytestmark = pytest.mark.unit


def test_everything_but_our_lines_goes_to_the_log(tmp_path):
    """Python prints, writes to fd 2 (as C++ warnings are) and child processes land in the
    log; the yielded stream reaches the real stdout; both descriptors come back after."""
    log = tmp_path / "logs" / "run.log"
    code = (
        "import os, subprocess, sys\n"
        "from pathlib import Path\n"
        "from vllm_clover.console import quiet_output\n"
        f"with quiet_output(Path({str(log)!r})) as out:\n"
        "    print('library print')\n"
        "    os.write(2, b'C++ warning\\n')\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"child\")'])\n"
        "    print('result', file=out)\n"
        "print('after')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "result\nafter\n" and done.stderr == ""
    assert log.read_text().split() == ["library", "print", "C++", "warning", "child"]


def test_verbose_redirects_nothing(capsys):
    with quiet_output(None) as out:
        print("shown", file=out)
        os.write(1, b"")  # fd 1 still the terminal's
    assert capsys.readouterr().out == "shown\n"
