"""Hooks the benchmarks install on a running engine's model runner (see the ledger): wall-clock
timers on some of its methods, run in the worker (`LLM.collective_rpc`). How it works:
docs/design/engine-layer.md, "Benchmark hooks"."""

from __future__ import annotations

import time
from typing import Any

TIMERS_ATTRIBUTE = "_vllm_clover_timers"  # {method: [seconds, calls]} on the model runner
DRAFTING = "propose_draft_token_ids"

# The model runner's methods that split one engine step, outermost first (vLLM 0.32's V1
# runner: execute_model runs the forward, sample_tokens samples and drafts).
STEP_PHASES = {
    "execute_model": "state update, input preparation, target forward and logits",
    "_prepare_inputs": "input preparation (positions, slots, spec-decode indices)",
    "_model_forward": "the target's forward (matmuls, attention, norms)",
    "sample_tokens": "sampling or rejection, bookkeeping and drafting",
    "_sample": "sampling, or the rejection sampler when drafts are verified",
    DRAFTING: "drafting (Clover: Augmenting Block and head loop)",
}


def time_methods(worker: Any, names: tuple[str, ...]) -> None:
    """Start timing every call of these methods of this worker's model runner."""
    runner = worker.model_runner
    timers = vars(runner).setdefault(TIMERS_ATTRIBUTE, {})
    for name in names:
        if name not in timers:
            timers[name] = [0.0, 0]
            setattr(runner, name, _timed(getattr(runner, name), timers[name]))


def method_times(worker: Any) -> dict[str, tuple[float, int]]:
    """{method: (seconds, calls)} since `time_methods` (empty if never installed)."""
    timers = getattr(worker.model_runner, TIMERS_ATTRIBUTE, {})
    return {name: (float(s), int(n)) for name, (s, n) in timers.items()}


def _timed(inner, stats: list) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            stats[0] += time.perf_counter() - started
            stats[1] += 1

    return timed  # an instance attribute shadows the method
