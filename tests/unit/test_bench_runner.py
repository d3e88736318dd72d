"""`vllm-clover bench`: the order of the engine jobs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_clover.bench.config import BenchConfig, Method

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)


def test_engine_jobs_alternate_methods_round_by_round():
    from vllm_clover.bench.runner import engine_jobs

    config = BenchConfig(
        methods=(VANILLA, CLOVER),
        batch_sizes=(1, 4),
        repeats=2,
        engines=("in-process", "multiprocess"),
    )
    jobs = engine_jobs(config, "target", [[{"role": "user", "content": "hi"}]])
    order = [(j.repeat, j.engine_mode, j.batch_size, j.method.name) for j in jobs]
    assert order[:4] == [
        (0, "in-process", 1, "vanilla"),
        (0, "in-process", 1, "clover"),
        (0, "in-process", 4, "vanilla"),
        (0, "in-process", 4, "clover"),
    ]
    assert len(order) == 2 * 2 * 2 * 2 and order[8][0] == 1  # round 2 after all of round 1
    assert order[8:10] == [(1, "in-process", 1, "clover"), (1, "in-process", 1, "vanilla")]
    assert not any(j.compiled for j in jobs)  # eager unless asked
    compiled = engine_jobs(replace(config, compiled=True), "target", [[{"role": "user"}]])
    assert all(j.compiled for j in compiled)


def test_a_parting_beyond_rounding_fails_the_bench_after_its_results(monkeypatch, capsys):
    """`vllm-clover bench` prints its table, then exits 2 naming the parting (the results
    are written by `run_bench` before it returns)."""
    from vllm_clover.bench import runner
    from vllm_clover.cli import main

    row = {
        "method": "clover",
        "kind": "clover",
        "engine_mode": "in-process",
        "batch_size": 1,
        "temperature": 0.0,
        "repeat": 0,
        "partings": [{"prompt": 2, "token": 5, "gap": 3.0}],
        "beyond_rounding": 1,
        "engine": {},
    }
    report = {
        "runs": [row],
        "summary": [],
        "config": {"dtype": "float32"},
        "machine": {"usable_cores": 2},
    }
    monkeypatch.setattr(runner, "run_bench", lambda config, command: report)
    assert main(["bench", "--methods", "clover", "--dtype", "float32"]) == 2
    captured = capsys.readouterr()
    assert "| method | engine | batch | T |" in captured.out
    assert (
        "vllm-clover bench: error: greedy output parted from vanilla's where vanilla's best "
        "token led by more than float32 rounding (0.0001): clover at batch 1 (in-process, "
        "round 1): prompt 2 at token 5, gap 3" in captured.err
    )
    row["beyond_rounding"] = 0  # ties only: no error
    assert main(["bench", "--methods", "clover", "--dtype", "float32"]) == 0
