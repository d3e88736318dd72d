"""The block_rest patch (patches/block_rest.py): which engines may rest the Augmenting Block,
and that the runner asks the drafter before it prepares propose.
The engine test (tests/engine/test_clover_scheduling.py) runs it in vLLM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover.patches.block_rest import rest_applies

pytestmark = pytest.mark.unit


def config(method="clover", layers=2, tree=None, async_scheduling=False, batches=1):
    hf_config = SimpleNamespace(num_augmenting_layers=layers)
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=method,
            speculative_token_tree=tree,
            draft_model_config=SimpleNamespace(hf_config=hf_config),
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        max_concurrent_batches=batches,
    )
    return vllm_config


def test_only_synchronous_chains_with_a_block_rest():
    assert rest_applies(config())
    for other in (
        {"method": "eagle"},
        {"layers": 0},
        {"tree": "[(0,), (1,)]"},
        {"async_scheduling": True},
        {"batches": 2},
    ):
        assert not rest_applies(config(**other)), other
    assert not rest_applies(SimpleNamespace(speculative_config=None))


def test_an_idle_drafter_answers_before_the_runner_prepares_propose(monkeypatch):
    """The runner's propose_draft_token_ids asks the drafter's idle_step (K, requests,
    tokens) first and returns its drafts; where it answers None, or the drafter has none,
    vLLM's own method runs."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_clover.patches.block_rest import patch_block_rest

    def vllm_propose(runner, scheduler_output, *args):
        return ("vllm", args)

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", vllm_propose)
    patch_block_rest()
    asked = []

    def idle_step(k, num_reqs, num_tokens):
        asked.append((k, num_reqs, num_tokens))
        return "idle" if k == 0 else None

    output = SimpleNamespace(num_spec_tokens_to_schedule=0, total_num_scheduled_tokens=12)
    runner = SimpleNamespace(
        drafter=SimpleNamespace(idle_step=idle_step), input_batch=SimpleNamespace(num_reqs=3)
    )
    assert GPUModelRunner.propose_draft_token_ids(runner, output, "sampled") == "idle"
    output.num_spec_tokens_to_schedule = 2
    assert GPUModelRunner.propose_draft_token_ids(runner, output, "sampled") == (
        "vllm",
        ("sampled",),
    )
    assert asked == [(0, 3, 12), (2, 3, 12)]
    other = SimpleNamespace(drafter=object(), input_batch=runner.input_batch)
    assert GPUModelRunner.propose_draft_token_ids(other, output, "x") == ("vllm", ("x",))
