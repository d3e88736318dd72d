"""The goodput_budget patch (integration/patches/scheduling.py): which engines get a
controller, and what each step teaches it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.integration import patches
from vllm_clover.integration.patches.scheduling import (
    GoodputLookup,
    goodput_controller,
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


def test_the_patch_is_applied_once_and_keeps_vllms_methods_underneath():
    from vllm.v1.core.sched.scheduler import Scheduler

    patches.apply_patches()
    patches.apply_patches()
    wrapped = Scheduler.update_from_output
    assert getattr(wrapped, "__vllm_clover_patch__", None) == "goodput_budget"
    assert getattr(wrapped.__wrapped__, "__vllm_clover_patch__", None) is None  # wrapped once
