"""The bench's drafting timer (integration/patches/hooks.py) on a stand-in worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.integration.patches.hooks import drafting_time, time_drafting

pytestmark = pytest.mark.unit


class Runner:
    def __init__(self) -> None:
        self.calls = []

    def propose_draft_token_ids(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "drafts"


def test_timer_counts_calls_and_passes_everything_through():
    worker = SimpleNamespace(model_runner=Runner())
    assert drafting_time(worker) == (0.0, 0)
    time_drafting(worker)
    time_drafting(worker)  # installing twice wraps once
    assert worker.model_runner.propose_draft_token_ids(1, k=2) == "drafts"
    seconds, calls = drafting_time(worker)
    assert calls == 1 and seconds >= 0.0
    assert worker.model_runner.calls == [((1,), {"k": 2})]
    other = Runner()  # only that runner instance is wrapped, not the class
    assert "propose_draft_token_ids" not in vars(other)
