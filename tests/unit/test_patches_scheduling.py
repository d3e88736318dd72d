"""The goodput_budget patch (integration/patches/scheduling.py): which engines get a
controller, and what each step teaches it."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from vllm_clover.integration import patches
from vllm_clover.integration.patches.scheduling import (
    GoodputLookup,
    block_backlog,
    drafting_subset,
    goodput_controller,
    observe_step,
    verified_drafts,
)
from vllm_clover.integration.trial_subset import TrialSubsets

pytestmark = pytest.mark.unit


def vllm_config(
    method="clover",
    budget="goodput",
    async_scheduling=False,
    dp=1,
    batches=1,
    tree=None,
    block_layers=2,
    defer_block=None,
):
    heads = SimpleNamespace(
        use_augmenting_block=block_layers > 0, num_augmenting_layers=block_layers
    )
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=method,
            draft_budget=budget,
            num_speculative_tokens=4,
            speculative_token_tree=tree,
            draft_model_config=SimpleNamespace(hf_config=heads),
            defer_block=defer_block,
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


def test_close_calls_from_k0_are_tried_only_where_the_blocks_rows_never_wait():
    """Heads whose block defers its rows at K = 0 (the default) try close calls only from a
    step that drafted; heads without a block, or with defer_block false, from any step."""
    assert goodput_controller(vllm_config()).config.explore_from_zero is False
    assert goodput_controller(vllm_config(block_layers=0)).config.explore_from_zero is True
    assert goodput_controller(vllm_config(defer_block=False)).config.explore_from_zero is True


def test_the_lookup_asks_the_controller_once_per_step():
    controller = goodput_controller(vllm_config())
    lookup = GoodputLookup(controller)
    assert [lookup[3] for _ in range(5)] == [4, 0, 3, 1, 2]  # the warm-up cycle
    assert controller.steps == 5


def test_the_backlog_counts_the_running_requests_rows_since_they_last_drafted():
    """a last drafted at 30 and has computed 40 tokens: 10 rows wait; b, never drafted for,
    has computed 12: all 12 wait. The lookup hands the sum to the controller's choice."""
    subsets = TrialSubsets(4)
    subsets.marks = {"a": 30}
    running = [SimpleNamespace(request_id="a", num_computed_tokens=40)]
    running.append(SimpleNamespace(request_id="b", num_computed_tokens=12))
    scheduler = SimpleNamespace(clover_subsets=subsets, running=running)
    assert block_backlog(scheduler) == 22
    seen = []
    controller = SimpleNamespace(choose=lambda batch, backlog: seen.append(backlog) or 0)
    assert GoodputLookup(controller, lambda: block_backlog(scheduler))[2] == 0 and seen == [22]


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
    assert verified_drafts(step, output) == [("a", 3, 2), ("b", 0, 0), ("d", 2, 2)]


def scheduled(tokens: dict[str, int], drafts: dict[str, list[int]], k: int) -> SimpleNamespace:
    return SimpleNamespace(
        num_scheduled_tokens=tokens,
        scheduled_spec_decode_tokens=drafts,
        total_num_scheduled_tokens=sum(tokens.values()),
        num_spec_tokens_to_schedule=k,
        finished_req_ids={"gone"},
    )


def test_a_trial_drafts_for_the_requests_least_behind_and_counts_only_their_drafts():
    """A trial of K = 2 for 2 of 3 requests: a (5 rows behind) and c (1) draft, b (never
    drafted for, 10 behind) does not. At the next step the verified drafts count as offered
    2 for a and c and 0 for b, and the trial's step is logged as a subset's."""
    controller = goodput_controller(vllm_config())
    scheduler = SimpleNamespace(
        clover_budget=controller,
        clover_subsets=TrialSubsets(2),
        clover_last_drafting=None,
        clover_step_started=time.perf_counter(),
        requests={r: SimpleNamespace(num_computed_tokens=10) for r in "abc"},
    )
    scheduler.clover_subsets.marks = {"a": 5, "c": 9, "gone": 3}
    controller.trial_size = 2
    trial = scheduled({"a": 1, "b": 1, "c": 1}, {}, k=2)
    trial.clover_drafting, trial.clover_caught_up = drafting_subset(scheduler, trial)
    assert trial.clover_drafting == ["a", "c"]
    assert trial.clover_caught_up == (10 - 5 - 1) + (10 - 9 - 1)  # behind, less their own row
    assert scheduler.clover_subsets.marks == {"a": 10, "c": 10}  # "gone" finished
    output = SimpleNamespace(req_id_to_index={"a": 0, "b": 1, "c": 2}, sampled_token_ids=[[1]] * 3)
    observe_step(scheduler, trial, output)
    assert controller.log.subset_steps == 1 and scheduler.clover_last_drafting == ["a", "c"]
    verify = scheduled({"a": 3, "b": 1, "c": 3}, {"a": [5, 6], "c": [7, 8]}, k=0)
    verify.clover_drafting, verify.clover_caught_up = None, 0
    output.sampled_token_ids = [[5, 9], [4], [7, 8, 2]]
    controller.acceptance.offered[:] = 0  # no prior, nothing from earlier steps
    observe_step(scheduler, verify, output)
    assert controller.acceptance.offered.tolist() == [2, 2, 0, 0]  # a and c, not b
    assert controller.log.subset_accepted == 1 + 2


def test_the_patch_is_applied_once_and_keeps_vllms_methods_underneath():
    from vllm.v1.core.sched.scheduler import Scheduler

    patches.apply_patches()
    patches.apply_patches()
    wrapped = Scheduler.update_from_output
    assert getattr(wrapped, "__vllm_clover_patch__", None) == "goodput_budget"
    assert getattr(wrapped.__wrapped__, "__vllm_clover_patch__", None) is None  # wrapped once
