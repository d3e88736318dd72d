"""Clover under vLLM's scheduler: outputs still equal vanilla decoding (greedy, float32).

Each case changes how vLLM schedules requests (prefix cache hits, chunked prefill,
preemption, per-request limits and stops, aborts, a K that changes with the batch, compiled
mode) and runs with each shipped configuration (no Augmenting Block, the paper's block with
its own draft KV cache, Clover-2). Each asserts that Clover drafted, that drafts were
accepted, and that the feature happened (cache hits, chunks, preemptions, aborts, K = 0
steps). The reference is plain vLLM on the same prompts (scheduling_cases.py), which is
batch invariant in float32 (test_reference_generation.py checks that). How much Clover
drafts, chosen per step and per request, is tested in test_clover_budget.py.
"""

from pathlib import Path

import pytest
from scheduling_cases import BLOCK, MAX_TOKENS, generate
from spec_checks import assert_clover_speculated, speculation, target_compilation

from helpers import fixed_budget_spec, in_process_llm, run_with_aborts
from vllm_clover.bench.measure import metric_total
from vllm_clover.bundled import CLOVER2_HEADS
from vllm_clover.modeling.checkpoint import read_config_json

pytestmark = pytest.mark.engine

ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


def test_prefix_caching_with_shared_prefixes(reference_target, clover_spec, scheduling_cases):
    """The second pass hits every full KV block of each prompt below its last token, as
    vanilla would. Heads that fuse the next token into their block's input (Clover-2) have
    draft KV at a block's last slot that read the token after the block; they keep a hit's
    last block where the request's next token is that one (patches ledger,
    prefix_block_drop), so they keep it here too, and give it up in the third pass, whose
    prompts differ from the first right after that block. Outputs equal vanilla's and
    drafts stay as good on cached blocks."""
    prompts, params, expected = scheduling_cases["shared_prefix"]
    diverging, diverging_params, diverging_expected = scheduling_cases["diverging"]
    config = read_config_json(clover_spec["model"])
    with in_process_llm(
        reference_target,
        speculative_config=clover_spec,
        max_num_seqs=16,
        enable_prefix_caching=True,
        block_size=BLOCK,
    ) as llm:
        first = generate(llm, prompts, params)
        hits_before = metric_total(llm, "vllm:prefix_cache_hits")
        accepted_first = metric_total(llm, ACCEPTED)
        second = generate(llm, prompts, params)  # every prompt is now a cache hit
        hits = metric_total(llm, "vllm:prefix_cache_hits") - hits_before
        accepted_second = metric_total(llm, ACCEPTED) - accepted_first
        third = generate(llm, diverging, diverging_params)
        diverging_hits = metric_total(llm, "vllm:prefix_cache_hits") - hits_before - hits
        stats = speculation(llm)
    assert first == expected and second == expected and third == diverging_expected
    full_blocks = [(len(p["prompt_token_ids"]) - 1) // BLOCK for p in prompts]
    assert min(full_blocks) > 1  # every prompt has a block to keep or drop
    assert hits == BLOCK * sum(full_blocks)
    dropped = 1 if config.get("fuse_next_token") else 0
    assert diverging_hits == BLOCK * sum(n - dropped for n in full_blocks[: len(diverging)])
    # Drafting over the cached blocks accepts what it did when they were computed (equal
    # counts on this project's CPU; the slack is for near-tie rounding on other kernels).
    assert abs(accepted_second - accepted_first) <= 0.05 * accepted_first
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])


def test_chunked_prefill_of_prompts_longer_than_the_token_budget(
    reference_target, clover_spec, scheduling_cases
):
    prompts, params, expected = scheduling_cases["shared_prefix"]
    prompts, params, expected = prompts[:6], params[:6], expected[:6]
    budget = 256
    assert min(len(p["prompt_token_ids"]) for p in prompts) > budget  # every prompt is chunked
    with in_process_llm(
        reference_target,
        speculative_config=clover_spec,
        max_num_seqs=6,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
        enable_prefix_caching=False,
    ) as llm:
        outputs = generate(llm, prompts, params)
        stats = speculation(llm)
    assert outputs == expected
    assert 0 < stats.max_step_tokens <= budget  # no step took a whole prompt: each was split
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])


def test_preemption_forced_by_a_tiny_kv_cache(reference_target, clover_spec, scheduling_cases):
    prompts, params, expected = scheduling_cases["plain"]
    with in_process_llm(
        reference_target,
        speculative_config=clover_spec,
        max_num_seqs=16,
        block_size=32,
        num_gpu_blocks_override=30,
        max_model_len=512,
    ) as llm:
        outputs = generate(llm, prompts, params)
        preemptions = metric_total(llm, "vllm:num_preemptions")
        stats = speculation(llm)
    assert preemptions > 0, "the KV cache was not small enough to force preemption"
    assert outputs == expected
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])


def test_mixed_max_tokens_and_stop_strings(reference_target, clover_spec, scheduling_cases):
    prompts, params, expected = scheduling_cases["mixed"]
    with in_process_llm(reference_target, speculative_config=clover_spec, max_num_seqs=16) as llm:
        outputs = generate(llm, prompts, params)
        stats = speculation(llm)
    assert outputs == expected
    assert {len(tokens) for tokens, _ in outputs} != {MAX_TOKENS}
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])


def test_aborted_requests_leave_the_others_unaffected(
    reference_target, clover_spec, scheduling_cases
):
    prompts, params, expected = scheduling_cases["plain"]
    aborted = [str(i) for i in range(0, 16, 3)]
    with in_process_llm(reference_target, speculative_config=clover_spec, max_num_seqs=16) as llm:
        finished, running_when_aborted = run_with_aborts(llm, prompts, params, aborted, 5)
        stats = speculation(llm)
    kept = [i for i in range(16) if i % 3 != 0]
    assert {i: finished[i] for i in kept} == {i: expected[i][0] for i in kept}
    assert running_when_aborted == set(aborted)  # every abort hit a request in flight
    assert all(len(finished.get(i, [])) < MAX_TOKENS for i in range(0, 16, 3))
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])


def test_dynamic_speculation_down_to_k_zero(reference_target, clover_spec, scheduling_cases):
    """K = 0 above 10 running requests, 2 for 5-10, all heads below: the mixed limits make the
    batch shrink through all three, so all three draft lengths must have run."""
    prompts, params, expected = scheduling_cases["mixed"]  # requests finish at different times
    k = clover_spec["num_speculative_tokens"]
    schedule = [[1, 4, k], [5, 10, 2], [11, 256, 0]]
    spec = {**clover_spec, "num_speculative_tokens_per_batch_size": schedule}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=16) as llm:
        outputs = generate(llm, prompts, params)
        stats = speculation(llm)
    assert outputs == expected
    assert {0, 2, k} <= set(stats.steps_by_k), stats.steps_by_k
    assert stats.drafts > 0 and stats.accepted > 0 and stats.drafter == "CloverProposer"


def _worker_idle(worker) -> int:
    return worker.model_runner.drafter.draft_log.idle


def test_the_block_rests_where_k_is_zero(reference_target, scheduling_cases):
    """Clover-2 heads, K = 0 above 4 running requests (a table; the goodput budget makes the
    same choice under load). Every K = 0 step is answered idle (patches/block_rest.py),
    prompt chunks included: the runner skips what it prepares for propose and the
    Augmenting Block its pass. Requests that ran through resting steps from their prompt on
    draft again once their batch shrinks to 4 and have drafts accepted (their holes cost
    acceptance, never correctness), and prompt pages written around rests stay in the
    prefix cache for the next request to reuse."""
    plain, plain_params, plain_expected = scheduling_cases["plain"]
    _, mixed_params, mixed_expected = scheduling_cases["mixed"]
    shared, shared_params, shared_expected = scheduling_cases["shared_prefix"]
    spec = fixed_budget_spec(CLOVER2_HEADS)
    k = spec["num_speculative_tokens"]
    spec["num_speculative_tokens_per_batch_size"] = [[1, 4, k], [5, 256, 0]]
    with in_process_llm(
        reference_target,
        speculative_config=spec,
        max_num_seqs=16,
        enable_prefix_caching=True,
        block_size=BLOCK,
    ) as llm:
        outputs = [generate(llm, plain, plain_params)]  # 16 at K = 0: the block rests
        (idle,) = llm.collective_rpc(_worker_idle)
        resting = speculation(llm)
        outputs.append(generate(llm, plain, mixed_params))  # the last ones at K = k
        tail = speculation(llm) - resting
        outputs.append(generate(llm, shared, shared_params))
        hits_before = metric_total(llm, "vllm:prefix_cache_hits")
        outputs.append(generate(llm, shared[:4], shared_params[:4]))  # at batch 4, K = k
        hits = metric_total(llm, "vllm:prefix_cache_hits") - hits_before
    assert outputs == [plain_expected, mixed_expected, shared_expected, shared_expected[:4]]
    assert idle == resting.steps_by_k[0] > 0  # every K = 0 step rested, prefilling ones too
    assert resting.drafts == 0 and set(resting.steps_by_k) == {0}
    assert tail.steps_by_k.get(k, 0) > 0 and tail.drafts > 0 and tail.accepted > 0
    full_blocks = sum((len(p["prompt_token_ids"]) - 1) // BLOCK for p in shared[:4])
    assert full_blocks > 0 and hits >= BLOCK * full_blocks  # no page left the prefix cache


def test_compiled_mode(reference_target, clover_spec, scheduling_cases, monkeypatch):
    """vLLM's default torch.compile mode on CPU: Dynamo captures the target once, Inductor
    compiles it (~70-90 s on 2 cores per engine: the cache is per engine configuration).

    -clover2's target graph also returns the middle layers (patch target_signal), so it
    compiles with Inductor. The reference and full heads read the plain target graph, the one
    vLLM compiles without speculation, so their engines run Dynamo's capture on the eager
    backend (VLLM_CPU_CI_ENV, as vLLM's CPU CI does): the proposer still reads the hidden
    states of a captured graph.
    """
    inductor = Path(clover_spec["model"]).name == CLOVER2_HEADS.name
    if not inductor:
        monkeypatch.setenv("VLLM_CPU_CI_ENV", "1")
    prompts, params, expected = scheduling_cases["plain"]
    with in_process_llm(
        reference_target, speculative_config=clover_spec, max_num_seqs=4, enforce_eager=False
    ) as llm:
        outputs = generate(llm, prompts[:4], params[:4])
        stats = speculation(llm)
        compiled = target_compilation(llm)
    assert compiled == ("DYNAMO_TRACE_ONCE", "inductor" if inductor else "eager", True)
    assert outputs == expected[:4]
    assert_clover_speculated(stats, k=clover_spec["num_speculative_tokens"])
