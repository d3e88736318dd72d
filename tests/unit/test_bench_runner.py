"""`vllm-clover bench`: the order of the engine jobs, and the tie check's reruns (which
chats, in which engines, for how long; the reruns themselves are in
tests/engine/test_bench_engine.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_clover.bench.config import BenchConfig, Method
from vllm_clover.bench.measure import Counters, Run
from vllm_clover.bench.runner import EngineJob, parted_lengths, tie_jobs

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


NGRAM = Method("ngram", "ngram", num_speculative_tokens=4)
CHATS = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]


def _result(method, tokens, repeat=0, mode="in-process", batch=1, temperature=0.0):
    job = EngineJob("target", method, batch, CHATS, (temperature,), 16, repeat, mode, "bfloat16")
    return (job, {temperature: Run(tokens, 1.0, Counters(steps=1))}, {})


def test_each_chat_reruns_up_to_its_latest_parting_per_mode_and_batch():
    """Round 0's clover parts at chat 1, token 2; round 1's ngram at chat 1, token 3 and chat
    2, token 0 (against round 1's vanilla, which differs from round 0's at chat 2)."""
    results = [
        _result(VANILLA, [[1, 2, 3], [4, 5, 6, 7], [8]]),
        _result(CLOVER, [[1, 2, 3], [4, 5, 0, 7], [8]]),
        _result(VANILLA, [[1, 2, 3], [4, 5, 6, 7], [9]], repeat=1),
        _result(NGRAM, [[1, 2, 3], [4, 5, 6, 0], [8]], repeat=1),
        _result(VANILLA, [[1, 2, 3], [4, 5, 6, 7], [8]], mode="multiprocess"),
        _result(CLOVER, [[1, 2, 3], [4, 5, 6, 7], [8]], mode="multiprocess"),  # equal
        _result(VANILLA, [[1], [2], [3]], batch=2, temperature=1.0),  # T > 0 is never compared
        _result(CLOVER, [[0], [0], [0]], batch=2, temperature=1.0),
    ]
    assert parted_lengths(results) == {("in-process", 1): {1: 4, 2: 1}}
    (job,) = tie_jobs(results)
    assert job.lengths == {1: 4, 2: 1}
    # the rerun takes a timed engine's settings (target, chats, dtype, max_tokens, ...)
    assert job.timed in [j for j, _, _ in results[:4]]


def test_a_run_whose_vanilla_has_not_run_is_not_compared():
    assert parted_lengths([_result(CLOVER, [[1], [2], [3]], repeat=1)]) == {}
    assert tie_jobs([]) == []
