"""`vllm-clover serve` starts vLLM's OpenAI server on the reference target.

Stopping it (SIGTERM mid-load, then a restart) is tested in test_load.py.
"""

import json
import re
import subprocess
import sys
import urllib.request

import pytest
from spec_checks import assert_clover_speculated, server_speculation

from helpers import REPO, running_server
from helpers import http_get as _get

pytestmark = pytest.mark.server


def _post_json(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _chat(base: str, content: str, max_tokens: int = 32) -> dict:
    return _post_json(
        base + "/v1/chat/completions",
        {
            "model": "smollm2-135m-instruct",
            "temperature": 0,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}],
        },
    )


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
    result = subprocess.run(
        [sys.executable, "-m", "vllm_clover.cli", "serve", "--help=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in ("--speculative-config", "--spec-method", "--port", "--tensor-parallel-size"):
        assert flag in result.stdout


def test_clover_server_via_spec_shorthands_matches_vanilla_and_reports_drafts(
    server, clover_heads, tmp_path
):
    """`--spec-method clover --spec-model DIR --spec-tokens K`; greedy text = vanilla text."""
    prompt = "Give me three tips for staying healthy."
    vanilla = _chat(server["base"], prompt, max_tokens=64)["choices"][0]["message"]["content"]
    args = ["--spec-method", "clover", "--spec-model", str(clover_heads), "--spec-tokens", "3"]
    with running_server(tmp_path / "clover.log", args) as clover:
        reply = _chat(clover["base"], prompt, max_tokens=64)
        metrics = _get(clover["base"] + "/metrics")
    assert reply["choices"][0]["message"]["content"] == vanilla
    assert_clover_speculated(server_speculation(metrics, clover["log"].read_text()), k=3)
