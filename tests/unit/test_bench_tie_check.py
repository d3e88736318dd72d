"""The bench's tie check (bench/runner.py): which chats to rerun, in which engines, for
how long; the reruns themselves are in tests/engine/test_bench_engine.py."""

from __future__ import annotations

import pytest

from vllm_clover.bench.config import Method
from vllm_clover.bench.measure import Counters, Run
from vllm_clover.bench.runner import EngineJob, parted_lengths, tie_jobs

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)
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
