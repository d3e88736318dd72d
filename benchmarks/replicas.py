"""Clover behind two replicas: vLLM's data parallelism, or two independent servers.

    python benchmarks/replicas.py --mode dp         # `vllm-clover serve --data-parallel-size 2`
    python benchmarks/replicas.py --mode processes   # two `vllm-clover serve` on two ports

Each replica (a DP engine, or a server) gets one of the machine's cores
(VLLM_CPU_OMP_THREADS_BIND) and a 1 GiB KV cache. The client sends --requests greedy chat
requests, spread round-robin over the servers (in dp mode vLLM's own coordinator spreads
them over the engines), then asks every replica the same question once more. Checks, per
replica: it finished requests and Clover drafted (spec-decode counters of /metrics > 0);
and all replicas gave the same greedy tokens. Prints a table; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import httpx
from soak import clover_server, metric_sum, spec_counters  # benchmarks/soak.py

from vllm_clover.assets.data import mtbench_questions
from vllm_clover.assets.target import REFERENCE_TARGET

SPEC_TOKENS = 3
SAME_QUESTION = "Give me three tips for staying healthy."


def _body(question: str, max_tokens: int) -> dict:
    return {
        "model": REFERENCE_TARGET,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": question}],
        "return_token_ids": True,
    }


async def _ask(client: httpx.AsyncClient, base: str, body: dict) -> list[int]:
    """One non-streaming chat request; its generated token ids."""
    response = await client.post(base + "/v1/chat/completions", json=body)
    response.raise_for_status()
    return response.json()["choices"][0]["token_ids"]


async def drive(bases: list[str], questions: list[str], max_tokens: int) -> None:
    """All questions at once, round-robin over `bases`."""
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(
            *(
                _ask(client, bases[i % len(bases)], _body(q, max_tokens))
                for i, q in enumerate(questions)
            )
        )


async def same_question_everywhere(targets: list[tuple[str, str | None]]) -> list[list[int]]:
    """SAME_QUESTION once per (base, engine): with an engine index, pinned to that DP rank."""
    async with httpx.AsyncClient(timeout=600) as client:
        results = []
        for base, engine in targets:
            headers = {} if engine is None else {"X-data-parallel-rank": engine}
            response = await client.post(
                base + "/v1/chat/completions", json=_body(SAME_QUESTION, 64), headers=headers
            )
            response.raise_for_status()
            results.append(response.json()["choices"][0]["token_ids"])
        return results


def replica_stats(metrics: str, engine: str | None) -> dict:
    """Finished requests and Clover's counters of one engine (all engines if None)."""
    labels = {} if engine is None else {"engine": engine}
    return {
        "requests": metric_sum(metrics, "vllm:request_success_total", **labels),
        **spec_counters(metrics, SPEC_TOKENS, **labels),
    }


@contextlib.contextmanager
def replicas(mode: str, log_dir: Path):
    """Yield [(base URL, engine label or None)] for the two replicas of `mode`."""
    if mode == "dp":
        with clover_server(
            log_dir / "replicas-dp.log",
            SPEC_TOKENS,
            ["--data-parallel-size", "2"],
            env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        ) as (base, _):
            yield [(base, "0"), (base, "1")]
        return
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                clover_server(
                    log_dir / f"replicas-{core}.log",
                    SPEC_TOKENS,
                    env={"VLLM_CPU_OMP_THREADS_BIND": str(core)},
                )
            )
            for core in (0, 1)
        ]
        yield [(base, None) for base, _ in servers]


def run(mode: str, num_requests: int, max_tokens: int, log_dir: Path) -> dict:
    """Start the replicas, drive them, and collect per-replica figures."""
    questions = [q.turns[0] for q in mtbench_questions()][:num_requests]
    started = time.monotonic()
    with replicas(mode, log_dir) as targets:
        up_s = time.monotonic() - started
        bases = sorted({base for base, _ in targets})
        start = time.monotonic()
        asyncio.run(drive(bases, questions, max_tokens))
        load_s = time.monotonic() - start
        same = asyncio.run(same_question_everywhere(targets))
        stats = [
            replica_stats(httpx.get(base + "/metrics", timeout=30).text, engine)
            for base, engine in targets
        ]
    return {
        "mode": mode,
        "startup_s": round(up_s, 1),
        "load_s": round(load_s, 1),
        "requests": num_requests,
        "max_tokens": max_tokens,
        "replicas": stats,
        "same_greedy_tokens": all(tokens == same[0] for tokens in same),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("dp", "processes"), default="dp")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--log-dir", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = parser.parse_args(argv)
    result = run(args.mode, args.requests, args.max_tokens, args.log_dir)
    print(
        f"mode {result['mode']}: up in {result['startup_s']} s, {result['requests']} requests "
        f"x {result['max_tokens']} tokens in {result['load_s']} s"
    )
    for i, stats in enumerate(result["replicas"]):
        tau = f"{stats['tau']:.3f}" if stats["tau"] else "-"
        print(
            f"  replica {i}: {stats['requests']:.0f} requests finished, {stats['drafts']:.0f} "
            f"drafts, {stats['accepted']:.0f} accepted, tau {tau}"
        )
    print(f"same greedy tokens on every replica: {result['same_greedy_tokens']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    ok = result["same_greedy_tokens"] and all(
        s["requests"] > 0 and s["drafts"] > 0 for s in result["replicas"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
