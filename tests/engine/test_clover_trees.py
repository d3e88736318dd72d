"""Token trees (speculative_token_tree) under vLLM: outputs equal vanilla decoding (greedy,
float32) with both shipped configurations, at max_num_seqs 1, 4 and 16 and under prefix
caching, chunked prefill, forced preemption and aborts, and with each checkpoint's default
tree ("default"). Each test asserts that trees were
drafted and verified and that paths off the rank-0 chain were accepted (what a chain cannot
accept), besides the feature it is about. T = 1 is in test_clover_sampling.py."""

import pytest
from spec_checks import (
    TEST_TREE,
    TEST_TREE_SIZE,
    assert_trees_verified,
    speculation,
    tree_stats,
)

from helpers import in_process_llm, mtbench_prompts, run_with_aborts
from vllm_clover.bench.measure import metric_total

pytestmark = pytest.mark.engine

MAX_TOKENS = 24
SYSTEM = "You are a meticulous assistant. Answer in plain English, in short paragraphs. " * 30


def _generate(llm, prompts, max_tokens=MAX_TOKENS):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def cases(reference_target, mtbench_path):
    """Prompts and their vanilla outputs: plain, and with a long shared system prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_target)
    plain = mtbench_prompts(tokenizer, mtbench_path, 16)
    shared = mtbench_prompts(tokenizer, mtbench_path, 6, system=SYSTEM)
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        return {"plain": (plain, _generate(llm, plain)), "shared": (shared, _generate(llm, shared))}


@pytest.fixture(scope="module")
def tree_spec(shipped_heads):
    return {"method": "clover", "model": str(shipped_heads), "speculative_token_tree": TEST_TREE}


def _check(llm, outputs, expected, tree_size=TEST_TREE_SIZE):
    spec, trees = speculation(llm), tree_stats(llm)
    assert outputs == expected
    assert_trees_verified(trees, tree_size, spec)
    assert len(spec.accepted_per_pos) == tree_size  # vLLM counts per position = per depth
    return spec, trees


@pytest.mark.parametrize("max_num_seqs", [1, 4, 16])
def test_greedy_tree_output_equals_vanilla(reference_target, tree_spec, cases, max_num_seqs):
    prompts, expected = cases["plain"]
    n = {1: 2, 4: 8, 16: 16}[max_num_seqs]
    with in_process_llm(
        reference_target, speculative_config=tree_spec, max_num_seqs=max_num_seqs
    ) as llm:
        outputs = _generate(llm, prompts[:n])
        spec, trees = _check(llm, outputs, expected[:n])
    assert spec.max_requests == max_num_seqs  # the batch filled up
    assert trees.accepted_by_depth[1] > 0  # paths two nodes deep were accepted


def test_tree_with_prefix_caching(reference_target, tree_spec, cases):
    prompts, expected = cases["shared"]
    with in_process_llm(
        reference_target,
        speculative_config=tree_spec,
        max_num_seqs=6,
        enable_prefix_caching=True,
    ) as llm:
        first, second = _generate(llm, prompts), _generate(llm, prompts)  # second: cache hits
        hits = metric_total(llm, "vllm:prefix_cache_hits")
        _check(llm, second, expected)
    assert first == expected and hits > 0


def test_tree_with_chunked_prefill(reference_target, tree_spec, cases):
    prompts, expected = cases["shared"]
    budget = 256
    assert min(len(p["prompt_token_ids"]) for p in prompts) > budget  # every prompt is chunked
    with in_process_llm(
        reference_target,
        speculative_config=tree_spec,
        max_num_seqs=6,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
        enable_prefix_caching=False,
    ) as llm:
        spec, _ = _check(llm, _generate(llm, prompts), expected)
    assert 0 < spec.max_step_tokens <= budget


def test_tree_with_forced_preemption(reference_target, tree_spec, cases):
    prompts, expected = cases["plain"]
    with in_process_llm(
        reference_target,
        speculative_config=tree_spec,
        max_num_seqs=16,
        block_size=32,
        num_gpu_blocks_override=30,
        max_model_len=512,
    ) as llm:
        _check(llm, _generate(llm, prompts), expected)
        preemptions = metric_total(llm, "vllm:num_preemptions")
    assert preemptions > 0


def test_tree_with_aborts(reference_target, tree_spec, cases):
    from vllm import SamplingParams

    prompts, expected = cases["plain"]
    aborted = [str(i) for i in range(0, 16, 3)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    with in_process_llm(reference_target, speculative_config=tree_spec, max_num_seqs=16) as llm:
        finished, _ = run_with_aborts(llm, prompts, [params] * len(prompts), aborted, 4)
        kept = [i for i in range(16) if str(i) not in aborted]
        _check(llm, [finished[i] for i in kept], [expected[i] for i in kept])
    assert all(len(finished.get(int(i), [])) < MAX_TOKENS for i in aborted)


def test_default_is_the_tree_the_checkpoint_records(reference_target, shipped_heads, cases):
    """ "default" drafts the checkpoint's own tree (config.json token_tree): every shipped
    checkpoint records one, the engine resolves to it, and it verifies like any tree."""
    from vllm_clover.modeling.config import CloverConfig
    from vllm_clover.tree import TokenTree

    recorded = CloverConfig.from_pretrained(shipped_heads).token_tree
    assert recorded is not None, f"{shipped_heads} records no token_tree"
    spec = {"method": "clover", "model": str(shipped_heads), "speculative_token_tree": "default"}
    prompts, expected = cases["plain"]
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=4) as llm:
        resolved = llm.llm_engine.vllm_config.speculative_config.speculative_token_tree
        _check(llm, _generate(llm, prompts[:8]), expected[:8], TokenTree.parse(recorded).num_nodes)
    assert resolved == recorded
