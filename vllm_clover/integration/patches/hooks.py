"""Hooks the benchmarks install on a running engine's model runner (see the ledger).

`time_drafting` wraps one model runner's `propose_draft_token_ids`: everything vLLM does to
draft one step (for Clover the Augmenting Block and the K head steps, for Medusa the heads,
for ngram the lookup). On CPU every call is synchronous, so the wall time inside it is the
drafting cost. The wrapper is an instance attribute of that runner only; nothing else changes.
Run both functions in the worker (`LLM.collective_rpc`).
"""

from __future__ import annotations

import time
from typing import Any

TIMER_ATTRIBUTE = "_vllm_clover_drafting_timer"  # [seconds, calls] on the model runner


def time_drafting(worker: Any) -> None:
    """Start timing every `propose_draft_token_ids` call of this worker's model runner."""
    runner = worker.model_runner
    if TIMER_ATTRIBUTE in vars(runner):
        return
    stats = [0.0, 0]
    inner = runner.propose_draft_token_ids

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            stats[0] += time.perf_counter() - started
            stats[1] += 1

    runner.propose_draft_token_ids = timed  # an instance attribute shadows the method
    setattr(runner, TIMER_ATTRIBUTE, stats)


def drafting_time(worker: Any) -> tuple[float, int]:
    """(seconds, calls) spent drafting since `time_drafting` (0, 0 if never installed)."""
    stats = getattr(worker.model_runner, TIMER_ATTRIBUTE, (0.0, 0))
    return float(stats[0]), int(stats[1])
