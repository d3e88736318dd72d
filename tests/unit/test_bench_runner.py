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
