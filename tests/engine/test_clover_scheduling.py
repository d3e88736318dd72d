"""Clover under vLLM's scheduler: outputs still equal vanilla decoding (greedy, float32).

Each case changes how vLLM schedules requests (prefix cache hits, chunked prefill,
preemption, per-request limits and stops, aborts, dynamic K, compiled mode); the reference
is plain vLLM on the same prompts, which is batch invariant in float32
(test_reference_generation.py checks that).
"""

import pytest

from helpers import in_process_llm
from vllm_clover.assets.data import mtbench_questions

pytestmark = pytest.mark.engine

MAX_TOKENS = 48
SHARED_PREFIX = (
    "You are a meticulous assistant. Answer in plain English, in short paragraphs, "
    "and never use lists unless asked. "
) * 20  # several 128-token blocks


def _prompts(tokenizer, mtbench_path, n, system=None):
    """Chat-templated token ids for the first n MT-Bench first turns."""
    prompts = []
    for question in mtbench_questions(mtbench_path)[:n]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": question.turns[0]}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(getattr(ids, "input_ids", ids))})
    return prompts


def _params(n, mixed=False):
    """Greedy; with mixed=True, per-request max_tokens and stop strings differ."""
    from vllm import SamplingParams

    if not mixed:
        return [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * n
    return [
        SamplingParams(
            temperature=0.0, max_tokens=8 + 7 * (i % 6), stop=[". "] if i % 3 == 0 else None
        )
        for i in range(n)
    ]


def _generate(llm, prompts, params):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outputs]


@pytest.fixture(scope="module")
def cases(reference_target, mtbench_path):
    """Prompts, params and the vanilla outputs for every case."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_target)
    plain = _prompts(tokenizer, mtbench_path, 16)
    shared = _prompts(tokenizer, mtbench_path, 16, system=SHARED_PREFIX)
    cases = {
        "plain": (plain, _params(16)),
        "shared_prefix": (shared, _params(16)),
        "mixed": (plain, _params(16, mixed=True)),
    }
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        return {name: (p, s, _generate(llm, p, s)) for name, (p, s) in cases.items()}


@pytest.fixture
def clover_spec(clover_heads):
    return {"method": "clover", "model": str(clover_heads), "num_speculative_tokens": 4}


def test_prefix_caching_with_shared_prefixes(reference_target, clover_spec, cases):
    prompts, params, expected = cases["shared_prefix"]
    with in_process_llm(
        reference_target,
        speculative_config=clover_spec,
        max_num_seqs=16,
        enable_prefix_caching=True,
        disable_log_stats=False,
    ) as llm:
        first = _generate(llm, prompts, params)
        second = _generate(llm, prompts, params)  # every prompt is now a cache hit
        hits = _counter(llm, "vllm:prefix_cache_hits")
    assert first == expected and second == expected
    assert hits > 0


def test_chunked_prefill_of_prompts_longer_than_the_token_budget(
    reference_target, clover_spec, cases
):
    prompts, params, expected = cases["shared_prefix"]
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
        assert _generate(llm, prompts, params) == expected


def test_preemption_forced_by_a_tiny_kv_cache(reference_target, clover_spec, cases):
    prompts, params, expected = cases["plain"]
    with in_process_llm(
        reference_target,
        speculative_config=clover_spec,
        max_num_seqs=16,
        block_size=32,
        num_gpu_blocks_override=40,
        max_model_len=512,
        disable_log_stats=False,
    ) as llm:
        outputs = _generate(llm, prompts, params)
        preemptions = _counter(llm, "vllm:num_preemptions")
    assert preemptions > 0, "the KV cache was not small enough to force preemption"
    assert outputs == expected


def test_mixed_max_tokens_and_stop_strings(reference_target, clover_spec, cases):
    prompts, params, expected = cases["mixed"]
    with in_process_llm(reference_target, speculative_config=clover_spec, max_num_seqs=16) as llm:
        outputs = _generate(llm, prompts, params)
    assert outputs == expected
    assert {len(tokens) for tokens, _ in outputs} != {MAX_TOKENS}


def test_aborted_requests_leave_the_others_unaffected(reference_target, clover_spec, cases):
    prompts, params, expected = cases["plain"]
    with in_process_llm(reference_target, speculative_config=clover_spec, max_num_seqs=16) as llm:
        engine = llm.llm_engine
        for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(str(i), prompt, param)
        finished = {}
        for step in range(10_000):
            for output in engine.step():
                if output.finished:
                    finished[int(output.request_id)] = list(output.outputs[0].token_ids)
            if step == 5:
                engine.abort_request([str(i) for i in range(0, 16, 3)])
            if not engine.has_unfinished_requests():
                break
    kept = [i for i in range(16) if i % 3 != 0]
    assert {i: finished[i] for i in kept} == {i: expected[i][0] for i in kept}
    assert all(len(finished.get(i, [])) < MAX_TOKENS for i in range(0, 16, 3))


def test_dynamic_speculation_down_to_k_zero(reference_target, clover_heads, cases):
    prompts, params, expected = cases["mixed"]  # requests finish at different times
    spec = {
        "method": "clover",
        "model": str(clover_heads),
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 10, 2], [11, 256, 0]],
    }
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=16, disable_log_stats=False
    ) as llm:
        outputs = _generate(llm, prompts, params)
        drafts = _counter(llm, "vllm:spec_decode_num_drafts")
    assert outputs == expected
    assert drafts > 0  # batches shrank below 11 requests, so K > 0 was used at some point


def test_compiled_mode(reference_target, clover_spec, cases):
    """vLLM's default torch.compile mode on CPU (~1 min to compile)."""
    prompts, params, expected = cases["plain"]
    with in_process_llm(
        reference_target, speculative_config=clover_spec, max_num_seqs=4, enforce_eager=False
    ) as llm:
        assert _generate(llm, prompts[:4], params[:4]) == expected[:4]


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)
