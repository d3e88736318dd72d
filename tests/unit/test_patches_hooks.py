"""The bench's drafting timer (patches/hooks.py) on a stand-in worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.patches.hooks import DRAFTING, method_times, time_methods

pytestmark = pytest.mark.unit


class Runner:
    def __init__(self) -> None:
        self.calls = []

    def propose_draft_token_ids(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "drafts"


def test_timer_counts_calls_and_passes_everything_through():
    worker = SimpleNamespace(model_runner=Runner())
    assert method_times(worker) == {}
    time_methods(worker, (DRAFTING,))
    time_methods(worker, (DRAFTING,))  # installing twice wraps once
    assert worker.model_runner.propose_draft_token_ids(1, k=2) == "drafts"
    seconds, calls = method_times(worker)[DRAFTING]
    assert calls == 1 and seconds >= 0.0
    assert worker.model_runner.calls == [((1,), {"k": 2})]
    other = Runner()  # only that runner instance is wrapped, not the class
    assert "propose_draft_token_ids" not in vars(other)


def test_step_phases_are_timed_per_method():
    class PhasedRunner(Runner):
        def _sample(self):
            return "sampled"

    worker = SimpleNamespace(model_runner=PhasedRunner())
    assert method_times(worker) == {}
    time_methods(worker, ("_sample", "propose_draft_token_ids"))
    time_methods(worker, (DRAFTING,))  # the bench's timer on top: still one wrapper per method
    assert worker.model_runner._sample() == "sampled"
    worker.model_runner._sample()
    worker.model_runner.propose_draft_token_ids()
    times = method_times(worker)
    assert {name: calls for name, (_, calls) in times.items()} == {
        "_sample": 2,
        "propose_draft_token_ids": 1,
    }
