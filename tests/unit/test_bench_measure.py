"""`vllm-clover bench`: counters from vLLM's metrics, their deltas, and runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.bench.measure import Counters, Run, counters_from_metrics, identical_outputs

pytestmark = pytest.mark.unit


def _metric(name, **fields):
    return SimpleNamespace(name=name, **fields)


def _snapshot(drafts, accepted, per_pos, steps):
    return [
        _metric("vllm:spec_decode_num_drafts", value=drafts),
        _metric("vllm:spec_decode_num_draft_tokens", value=4 * drafts),
        _metric("vllm:spec_decode_num_accepted_tokens", value=accepted),
        _metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=per_pos),
        _metric("vllm:iteration_tokens_total", count=steps, sum=0.0),
        _metric("vllm:generation_tokens", value=999),
    ]


# ------------------------------------------------------------------ counters and deltas
def test_counters_from_metrics_sum_label_sets():
    metrics = _snapshot(10, 6, [4, 2], 12) + _snapshot(5, 1, [1, 0, 0], 3)  # two engines
    counters = counters_from_metrics(metrics, drafting=(1.5, 7))
    assert counters == Counters(15, 60, 7, (5, 2, 0), 15, 1.5, 7)


def test_counter_delta_tau_and_per_position_rates():
    before = counters_from_metrics(_snapshot(2, 1, [1, 0, 0, 0], 5), drafting=(0.5, 2))
    after = counters_from_metrics(_snapshot(12, 9, [6, 2, 1, 0], 17), drafting=(2.0, 12))
    delta = after - before
    assert (delta.drafts, delta.draft_tokens, delta.accepted, delta.steps) == (10, 40, 8, 12)
    assert delta.accepted_per_pos == (5, 2, 1, 0)
    assert delta.drafting_seconds == pytest.approx(1.5) and delta.drafting_calls == 10
    assert delta.tau == pytest.approx(1.8)  # 1 + 8/10, the bonus token included
    assert delta.acceptance_rates == pytest.approx([0.5, 0.2, 0.1, 0.0])


def test_counters_without_drafts_have_no_tau():
    vanilla = counters_from_metrics([_metric("vllm:iteration_tokens_total", count=9, sum=1.0)])
    assert vanilla.tau is None and vanilla.acceptance_rates == [] and vanilla.steps == 9
    # a first snapshot before any draft has no per-position vector yet
    assert (Counters(drafts=2, accepted_per_pos=(1, 1)) - Counters()).accepted_per_pos == (1, 1)


def test_run_throughput_and_step_time():
    run = Run([[1, 2, 3], [4]], seconds=2.0, counters=Counters(steps=4))
    assert (run.output_tokens, run.tokens_per_second, run.seconds_per_step) == (4, 2.0, 0.5)
    assert Run([[1]], 1.0, Counters()).seconds_per_step is None


def test_identical_outputs_counts_equal_prompts():
    assert identical_outputs([[1, 2], [3], [4, 5]], [[1, 2], [3, 9], [4, 5]]) == 2
    with pytest.raises(ValueError, match="not the same prompts"):
        identical_outputs([[1]], [[1], [2]])
