"""`vllm-clover serve` starts vLLM's OpenAI server on the reference target and stops cleanly."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO

pytestmark = pytest.mark.server

STARTUP_TIMEOUT_S = 240
SHUTDOWN_TIMEOUT_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _post_json(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running_server(log_path, extra_args=()):
    """`vllm-clover serve smollm2-135m-instruct ...` on a free port; killed on exit."""
    port = _free_port()
    command = [sys.executable, "-m", "vllm_clover.cli", "serve", "smollm2-135m-instruct",
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--enforce-eager", "--max-model-len", "1024", *extra_args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                _get(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail(f"server did not come up:\n{log_path.read_text()[-5000:]}")
        yield {"base": base, "process": process, "log": log_path}
    finally:
        if process.poll() is None:  # the shutdown test normally stopped it already
            os.killpg(process.pid, signal.SIGKILL)


def _chat(base: str, content: str, max_tokens: int = 32) -> dict:
    return _post_json(base + "/v1/chat/completions", {
        "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}]})


def _counter(metrics: str, name: str) -> float:
    match = re.search(rf"^vllm:{name}(?:_total)?\{{[^}}]*\}} ([\d.e+]+)$", metrics, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


@pytest.fixture(scope="module")
def server(reference_target, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("server") / "server.log") as running:
        yield running


def test_chat_completion_answers_and_metrics_count_it(server):
    base = server["base"]
    assert json.loads(_get(base + "/v1/models"))["data"][0]["id"] == "smollm2-135m-instruct"
    reply = _chat(base, "What is the capital of France?")
    assert "Paris" in reply["choices"][0]["message"]["content"]
    metrics = _get(base + "/metrics")
    assert _counter(metrics, "generation_tokens") == reply["usage"]["completion_tokens"]
    assert re.search(r"vllm-clover [\d.]+ active", server["log"].read_text())


def test_serve_help_lists_vllm_serve_arguments():
    result = subprocess.run([sys.executable, "-m", "vllm_clover.cli", "serve", "--help=all"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in ("--speculative-config", "--spec-method", "--port", "--tensor-parallel-size"):
        assert flag in result.stdout


def test_clover_server_via_spec_shorthands_matches_vanilla_and_reports_drafts(
        server, clover_heads, tmp_path):
    """`--spec-method clover --spec-model DIR --spec-tokens K`; greedy text = vanilla text."""
    prompt = "Give me three tips for staying healthy."
    vanilla = _chat(server["base"], prompt, max_tokens=64)["choices"][0]["message"]["content"]
    args = ["--spec-method", "clover", "--spec-model", str(clover_heads), "--spec-tokens", "3"]
    with running_server(tmp_path / "clover.log", args) as clover:
        reply = _chat(clover["base"], prompt, max_tokens=64)
        metrics = _get(clover["base"] + "/metrics")
    assert reply["choices"][0]["message"]["content"] == vanilla
    assert _counter(metrics, "spec_decode_num_drafts") > 0
    assert _counter(metrics, "spec_decode_num_draft_tokens") == 3 * _counter(
        metrics, "spec_decode_num_drafts")
    assert "Clover: drafting with CloverProposer" in clover["log"].read_text()


def test_sigterm_stops_the_server_cleanly(server):
    """Runs last in this module: it stops the shared server."""
    process = server["process"]
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running {SHUTDOWN_TIMEOUT_S} s after SIGTERM")
    assert process.returncode in (0, -signal.SIGTERM), server["log"].read_text()[-3000:]
