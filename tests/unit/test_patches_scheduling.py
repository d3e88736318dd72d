"""The goodput_budget patch (patches/scheduling.py): which engines get a
controller, and what each step teaches it."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from vllm_clover import patches
from vllm_clover.patches.channel import SchedulerChannel
from vllm_clover.patches.scheduling import (
    GoodputLookup,
    goodput_controller,
    observe_step,
    verified_drafts,
)

pytestmark = pytest.mark.unit


def vllm_config(
    method="clover",
    budget="goodput",
    async_scheduling=False,
    dp=1,
    batches=1,
    tree=None,
):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=method,
            draft_budget=budget,
            num_speculative_tokens=4,
            speculative_token_tree=tree,
        ),
        scheduler_config=SimpleNamespace(
            async_scheduling=async_scheduling, max_num_batched_tokens=2048
        ),
        parallel_config=SimpleNamespace(data_parallel_size=dp),
        max_concurrent_batches=batches,
    )


def test_only_a_synchronous_clover_engine_with_goodput_gets_a_controller():
    controller = goodput_controller(vllm_config())
    assert controller is not None and controller.config.max_k == 4
    assert controller.config.max_tokens == 2048
    assert goodput_controller(vllm_config(budget="fixed")) is None
    assert goodput_controller(vllm_config(tree="[(0,), (1,)]")) is None  # the runner's budget
    assert goodput_controller(vllm_config(method="ngram")) is None
    assert goodput_controller(SimpleNamespace(speculative_config=None)) is None
    for unsupported in ({"async_scheduling": True}, {"dp": 2}, {"batches": 2}):
        assert goodput_controller(vllm_config(**unsupported)) is None, unsupported


def test_the_lookup_asks_the_controller_once_per_step():
    """The warm-up cycle advances on steps that decoded: top, 0, 0, top - 1, 1, ..."""
    controller = goodput_controller(vllm_config())
    lookup = GoodputLookup(controller, SimpleNamespace(running=[]))
    picks = []
    for _ in range(6):
        picks.append(lookup[3])
        controller.observe_step(0.05, 3, picks[-1], 3, [(0, 0)] * 3)
    assert picks == [4, 0, 0, 3, 1, 2] and controller.steps == 6


def test_the_lookup_tells_the_controller_when_a_step_carries_prompt_tokens(monkeypatch):
    """A running request with more than its last token still to compute is a prompt chunk
    (or a preempted request computing its tokens again); a decoding request has one."""
    controller = goodput_controller(vllm_config())
    seen = []
    monkeypatch.setattr(controller, "choose", lambda batch, prefill: seen.append(prefill) or 0)
    decoding = SimpleNamespace(num_computed_tokens=9, num_tokens=10)
    prompt = SimpleNamespace(num_computed_tokens=0, num_tokens=10)
    cached = SimpleNamespace(num_computed_tokens=9, num_tokens=10)  # a whole-prompt cache hit
    scheduler = SimpleNamespace(running=[decoding])
    lookup = GoodputLookup(controller, scheduler)
    lookup[1]
    scheduler.running = [decoding, prompt]  # vLLM replaces the list as requests finish
    lookup[2]
    scheduler.running = [cached]
    lookup[1]
    assert seen == [False, True, False]


def test_verified_drafts_follow_the_docstring_example():
    step = SimpleNamespace(
        num_scheduled_tokens={"a": 4, "b": 1, "c": 37, "d": 3},
        scheduled_spec_decode_tokens={"a": [5, 9, 2], "d": [8, 8]},
    )
    output = SimpleNamespace(
        req_id_to_index={"a": 0, "b": 1, "c": 2, "d": 3},
        sampled_token_ids=[[5, 9, 7], [11], [12], [8, 8, 1]],
    )
    # a: 3 drafts, 2 accepted; b: none drafted; c: a prefill chunk (skipped); d: all accepted
    assert verified_drafts(step, output) == [(3, 2), (0, 0), (2, 2)]


def test_a_step_teaches_the_controller_its_time_k_and_verified_drafts():
    """A step of K = 0 that verified a's 2 drafts (1 accepted) and c's 2 (both), drafted
    under the previous step's K = 2; b decoded without drafts."""
    controller = goodput_controller(vllm_config())
    controller.last_k = 2
    channel = SchedulerChannel(controller, step_started=time.perf_counter() - 0.05)
    step = SimpleNamespace(
        num_scheduled_tokens={"a": 3, "b": 1, "c": 3},
        scheduled_spec_decode_tokens={"a": [5, 6], "c": [7, 8]},
        total_num_scheduled_tokens=7,
        num_spec_tokens_to_schedule=0,
    )
    output = SimpleNamespace(
        req_id_to_index={"a": 0, "b": 1, "c": 2}, sampled_token_ids=[[5, 9], [4], [7, 8, 2]]
    )
    controller.acceptance.offered[:] = 0  # no prior, nothing from earlier steps
    observe_step(channel, step, output)
    assert controller.acceptance.offered.tolist() == [3, 3, 0, 0]  # every request offered 2
    assert controller.last_k == 0 and controller.cost.observations == 1
    assert controller.measured[(4, 0)] == 1  # a decode step of batch 3 (bucket 4) at K = 0


def test_the_patch_is_applied_once_and_keeps_vllms_methods_underneath():
    from vllm.v1.core.sched.scheduler import Scheduler

    patches.apply_patches()
    patches.apply_patches()
    wrapped = Scheduler.update_from_output
    assert getattr(wrapped, "__vllm_clover_patch__", None) == "goodput_budget"
    assert getattr(wrapped.__wrapped__, "__vllm_clover_patch__", None) is None  # wrapped once
