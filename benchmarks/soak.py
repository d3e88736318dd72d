"""Soak test: a Clover server under a steady stream of requests, for a bounded time.

Starts `vllm-clover serve` on the reference target with the bundled Clover heads (float32,
eager, K=3), then keeps --concurrency requests in flight (MT-Bench first turns, max_tokens
cycling over 16..128, streamed and not, greedy and T=0.8) until --requests have completed
or --duration seconds have passed. Every --sample-every seconds it records the resident
memory (RSS) of every server process (API server, engine core, worker) and the
speculative-decoding counters of /metrics. Prints a summary and writes JSON; exits 1 on any
failed request, or if the servers' total RSS grew by more than --max-rss-growth-mib from
the end of the warm-up (240 s by default) to the end of the run (600 s).

    python benchmarks/soak.py --out docs/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from vllm_clover.assets.target import REFERENCE_TARGET
from vllm_clover.bundled import REFERENCE_HEADS

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = (16, 32, 64, 96, 128)
TEMPERATURES = (0.0, 0.8)
MIB = 2**20


@contextlib.contextmanager
def clover_server(
    log_path: Path,
    spec_tokens: int = 3,
    extra_args=(),
    kv_cache_gib: int = 1,
    env: dict[str, str] | None = None,
):
    """`vllm-clover serve` (reference target + bundled Clover heads) on a free local port.

    spec_tokens=0: the same server without speculation (a baseline). `env` is added to the
    server's environment. Yields (base URL, Popen) once /health answers; on exit SIGTERMs
    the server's process group, then SIGKILLs whatever is left of it, so no engine process
    outlives the run.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {
        "method": "clover",
        "model": str(REFERENCE_HEADS),
        "num_speculative_tokens": spec_tokens,
    }
    command = [sys.executable, "-m", "vllm_clover.cli", "serve", REFERENCE_TARGET]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    command += ["--enforce-eager", "--max-model-len", "2048", *extra_args]
    if spec_tokens:
        command += ["--speculative-config", json.dumps(spec)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, process, log_path)
        yield base, process
    finally:
        stop_group(process)


def _wait_healthy(
    base: str, process: subprocess.Popen, log_path: Path, timeout: float = 300
) -> None:
    """Block until GET /health answers 200; RuntimeError if the server dies or is too slow."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(
        f"server at {base} did not come up; log {log_path}:\n" + log_path.read_text()[-3000:]
    )


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM the process group led by `process`, wait, then SIGKILL the rest of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=timeout)


def tree_rss(pid: int) -> dict[str, int]:
    """RSS in bytes of the server `pid` (the API server) and all its descendants.

    Keyed "name pid"; vLLM names its engine core and worker processes VLLM::...
    """
    root = psutil.Process(pid)
    rss = {}
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            name = "api-server" if process.pid == pid else process.name()
            rss[f"{name} {process.pid}"] = process.memory_info().rss
    return rss


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the /metrics samples called `name` whose labels include `labels` (0 if none)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def spec_counters(text: str, spec_tokens: int, **labels: str) -> dict:
    """Speculative-decoding counters of /metrics (samples with `labels`, e.g. engine="1"),
    with tau = 1 + accepted / drafts and the per-position acceptance rates."""
    prefix = "vllm:spec_decode_num_"
    drafts = metric_sum(text, prefix + "drafts_total", **labels)
    accepted = metric_sum(text, prefix + "accepted_tokens_total", **labels)
    per_pos = [
        metric_sum(text, prefix + "accepted_tokens_per_pos_total", position=str(i), **labels)
        for i in range(spec_tokens)
    ]
    return {
        "drafts": drafts,
        "draft_tokens": metric_sum(text, prefix + "draft_tokens_total", **labels),
        "accepted": accepted,
        "accepted_per_pos": per_pos,
        "tau": 1 + accepted / drafts if drafts else None,
        "acceptance_per_pos": [a / drafts for a in per_pos] if drafts else None,
    }


@dataclass
class Load:
    """The request stream's budget and what it produced."""

    prompts: list[str]
    max_requests: int
    deadline: float
    issued: int = 0
    completed: int = 0
    completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def next_body(self) -> dict | None:
        """The next request, or None once the count or time budget is spent."""
        if self.issued >= self.max_requests or time.monotonic() >= self.deadline:
            return None
        i, self.issued = self.issued, self.issued + 1
        body = {
            "model": REFERENCE_TARGET,
            "max_tokens": MAX_TOKENS[i % len(MAX_TOKENS)],
            "messages": [{"role": "user", "content": self.prompts[i % len(self.prompts)]}],
            "temperature": TEMPERATURES[i % len(TEMPERATURES)],
            "stream": i % 3 != 0,
        }
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        return body


async def _one_request(client: httpx.AsyncClient, base: str, body: dict) -> int:
    """Send one chat request; return its completion tokens. Raises on any failure."""
    url = base + "/v1/chat/completions"
    if not body["stream"]:
        response = await client.post(url, json=body)
        response.raise_for_status()
        reply = response.json()
        assert reply["choices"][0]["finish_reason"] in ("stop", "length"), reply
        return reply["usage"]["completion_tokens"]
    usage, finish = None, None
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])
                assert "error" not in chunk, chunk
                usage = chunk.get("usage") or usage
                finish = next(
                    (c["finish_reason"] for c in chunk["choices"] if c.get("finish_reason")), finish
                )
    assert finish in ("stop", "length") and usage, (finish, usage)
    return usage["completion_tokens"]


async def _client(client: httpx.AsyncClient, base: str, load: Load) -> None:
    """One closed-loop client: send the next request as soon as the previous one is done."""
    while (body := load.next_body()) is not None:
        start = time.monotonic()
        try:
            tokens = await _one_request(client, base, body)  # not `+= await`: lost updates
        except (httpx.HTTPError, AssertionError, ValueError, KeyError) as error:
            load.errors.append(f"{type(error).__name__}: {error}"[:300])
            continue
        load.completion_tokens += tokens
        load.latencies.append(time.monotonic() - start)
        load.completed += 1


async def _sampler(
    client: httpx.AsyncClient,
    base: str,
    pid: int,
    load: Load,
    every: float,
    spec_tokens: int,
    samples: list,
    done: asyncio.Event,
) -> None:
    """Every `every` seconds (and once at the end): RSS per server process, spec counters."""
    start = time.monotonic()
    while True:
        metrics = (await client.get(base + "/metrics")).text
        rss = tree_rss(pid)
        samples.append(
            {
                "t": round(time.monotonic() - start, 1),
                "completed": load.completed,
                "rss_total_mib": round(sum(rss.values()) / MIB, 1),
                "rss_mib": {k: round(v / MIB, 1) for k, v in rss.items()},
                "spec": spec_counters(metrics, spec_tokens),
            }
        )
        if done.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), every)


async def soak(base: str, pid: int, load: Load, args) -> list[dict]:
    """Run the clients and the sampler until the budget is spent; the samples."""
    samples: list[dict] = []
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        sampler = asyncio.create_task(
            _sampler(client, base, pid, load, args.sample_every, args.spec_tokens, samples, done)
        )
        await asyncio.gather(*(_client(client, base, load) for _ in range(args.concurrency)))
        done.set()
        await sampler
    return samples


def memory_growth(samples: list[dict], warmup_s: float) -> dict:
    """Total RSS in MiB: after warm-up, at the end (mean of the last 3 samples), the growth
    between them, and the growth over the last third of the run (~0 once it plateaus)."""
    after = [s for s in samples if s["t"] >= warmup_s] or samples[-1:]
    baseline = after[0]["rss_total_mib"]
    end = sum(s["rss_total_mib"] for s in after[-3:]) / len(after[-3:])
    last_third = [s for s in samples if s["t"] >= samples[-1]["t"] * 2 / 3]
    return {
        "baseline_mib": baseline,
        "end_mib": round(end, 1),
        "peak_mib": max(s["rss_total_mib"] for s in after),
        "growth_mib": round(end - baseline, 1),
        "baseline_t": after[0]["t"],
        "growth_last_third_mib": round(
            last_third[-1]["rss_total_mib"] - last_third[0]["rss_total_mib"], 1
        ),
        "requests_last_third": last_third[-1]["completed"] - last_third[0]["completed"],
    }


def summarize(load: Load, samples: list[dict], elapsed: float, args) -> dict:
    """The run's figures: requests, errors, throughput, latency, memory, acceptance."""
    latencies = sorted(load.latencies)
    growth = memory_growth(samples, args.warmup)
    return {
        "duration_s": round(elapsed, 1),
        "requests_completed": load.completed,
        "errors": len(load.errors),
        "error_examples": load.errors[:5],
        "requests_per_s": round(load.completed / elapsed, 3),
        "completion_tokens_per_s": round(load.completion_tokens / elapsed, 1),
        "latency_p50_s": round(latencies[len(latencies) // 2], 2) if latencies else None,
        "latency_max_s": round(latencies[-1], 2) if latencies else None,
        "memory": growth,
        "max_rss_growth_mib": args.max_rss_growth_mib,
        "memory_ok": growth["growth_mib"] <= args.max_rss_growth_mib,
        "spec": samples[-1]["spec"],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "samples": samples,
    }


def print_summary(result: dict) -> None:
    """The headline figures, one per line."""
    memory, spec = result["memory"], result["spec"]
    print(
        f"duration {result['duration_s']} s, {result['requests_completed']} requests completed "
        f"({result['requests_per_s']} req/s, {result['completion_tokens_per_s']} tokens/s), "
        f"errors {result['errors']}"
    )
    print(f"latency p50 {result['latency_p50_s']} s, max {result['latency_max_s']} s")
    print(
        f"server RSS (all processes): {memory['baseline_mib']} MiB at t={memory['baseline_t']} s "
        f"(after warm-up) -> {memory['end_mib']} MiB at the end (peak {memory['peak_mib']}), "
        f"growth {memory['growth_mib']} MiB (bound {result['max_rss_growth_mib']}): "
        f"{'ok' if result['memory_ok'] else 'EXCEEDED'}; over the last third of the run "
        f"{memory['growth_last_third_mib']} MiB in {memory['requests_last_third']} requests"
    )
    first, last = result["samples"][0]["rss_mib"], result["samples"][-1]["rss_mib"]
    for name in last:
        print(f"  {name}: {first.get(name, float('nan'))} -> {last[name]} MiB")
    if spec["tau"] is not None:
        rates = ", ".join(f"{r:.3f}" for r in spec["acceptance_per_pos"])
        print(
            f"Clover: {spec['drafts']:.0f} drafts, {spec['accepted']:.0f} accepted tokens, "
            f"tau {spec['tau']:.3f}, per-position acceptance {rates}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load at most")
    parser.add_argument("--requests", type=int, default=5000, help="requests at most")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--spec-tokens", type=int, default=3, help="K; 0 = no speculation")
    parser.add_argument("--sample-every", type=float, default=15)
    parser.add_argument(
        "--warmup",
        type=float,
        default=240,
        help="seconds before the RSS baseline (docs/serving.md: the worker's RSS "
        "grows in steps while it meets new batch shapes, then levels off)",
    )
    parser.add_argument("--max-rss-growth-mib", type=float, default=100)
    parser.add_argument("--log", type=Path, default=Path("soak-server.log"))
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    from vllm_clover.assets.data import mtbench_questions

    prompts = [q.turns[0] for q in mtbench_questions()]
    with clover_server(args.log, args.spec_tokens) as (base, process):
        load = Load(prompts, args.requests, time.monotonic() + args.duration)
        start = time.monotonic()
        samples = asyncio.run(soak(base, process.pid, load, args))
        result = summarize(load, samples, time.monotonic() - start, args)
    print_summary(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["errors"] == 0 and result["memory_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
