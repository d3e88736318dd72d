"""Clover with the prompt lookup ("lookup": hybrid/): each request's chain from the heads or
from its history, lossless as Clover alone: greedy outputs equal vanilla's at batch 1, 4 and
16, and under prefix caching, chunked prefill, preemption and aborts at once; at T = 1 the
samples follow vanilla's distribution (chi-square, with its power control). Every test
asserts that both sources drafted and that drafts of each were accepted."""

from __future__ import annotations

import pytest
from spec_checks import assert_clover_speculated, speculation
from test_clover_sampling import ALPHA, chi_square_homogeneity

from helpers import in_process_llm, run_with_aborts
from vllm_clover.bench.measure import metric_total
from vllm_clover.bundled import CLOVER2_HEADS, REFERENCE_HEADS
from vllm_clover.hybrid.drafter import lookup_counts

pytestmark = pytest.mark.engine

MAX_TOKENS = 48
# Requests whose answers copy their prompts' spans (what the lookup is for) beside ones that
# do not (what the heads are for).
TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank every morning.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b",
    "Water boils at one hundred degrees Celsius at sea level.",
]
ASKS = ["Repeat this text exactly:", "Copy this, then explain it briefly:"]
COPYING = [f"{ask}\n{text}" for ask in ASKS for text in TEXTS]
FRESH = ["Write a haiku about autumn.", "What is a prime number?", "Name three fruits."] * 3
PROMPTS = (COPYING + FRESH)[:16]
LOOKUP = {"lookup": {"min_n": 2, "max_n": 4}}


# Batch 1 runs four requests, two that copy and two that do not, so both sources get drafts
ALONE = [0, 4, 8, 12]


def _chats(rows) -> list:
    return [[{"role": "user", "content": PROMPTS[i]}] for i in rows]


def _greedy(max_tokens: int = MAX_TOKENS):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _spec(**extra) -> dict:
    spec = {"method": "clover", "model": str(REFERENCE_HEADS), "num_speculative_tokens": 4}
    return {**spec, "draft_budget": "fixed", **LOOKUP, **extra}


def _sources(llm, stats) -> tuple[int, int, int, int]:
    """(lookup draft tokens verified, lookup accepted, Clover's accepted, steps drafted
    from the lookup alone)."""
    ((verified, accepted, lookup_only),) = llm.collective_rpc(lookup_counts)
    return verified, accepted, stats.accepted - accepted, lookup_only


def _rested(worker) -> int:
    """Steps that came to `propose` with nothing for the heads and skipped the block's pass."""
    return worker.model_runner.drafter.draft_log.rested


def _drafts_after_bookkeeping(worker) -> bool:
    """Whether the worker's runner proposes after its bookkeeping (vLLM's sample_tokens:
    disable_padded_drafter_batch, as the engine resolved it)."""
    return worker.model_runner.speculative_config.disable_padded_drafter_batch


def assert_both_sources_drafted_and_were_accepted(llm, stats) -> int:
    """Returns the steps drafted from the lookup alone (the head loop skipped)."""
    verified, accepted, clover, lookup_only = _sources(llm, stats)
    assert verified > 0 and accepted > 0, ("lookup", verified, accepted)
    assert clover > 0 and stats.draft_tokens > verified, ("clover", stats)
    return lookup_only


@pytest.fixture(scope="module")
def vanilla(reference_target) -> list[list[int]]:
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        return _tokens(llm.chat(_chats(range(16)), _greedy(), use_tqdm=False))


# "after": vLLM drafts after the step's bookkeeping (disable_padded_drafter_batch), where the
# batch already holds the step's tokens when the lookup reads them; "goodput": the draft
# budget chooses K per step (0 among them: such a step still settles the lookup's rates);
# "clover2": heads with an Augmenting Block, which rests at the lookup's steps
@pytest.mark.parametrize(
    ("max_num_seqs", "variant"),
    [(1, None), (1, "clover2"), (4, None), (16, None), (4, "after"), (4, "goodput")],
)
def test_greedy_output_equals_vanilla(reference_target, vanilla, max_num_seqs, variant):
    rows = ALONE if max_num_seqs == 1 else range(16)
    spec = _spec(disable_padded_drafter_batch=variant == "after")
    if variant == "goodput":
        spec["draft_budget"] = "goodput"
    if variant == "clover2":
        spec["model"] = str(CLOVER2_HEADS)
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=max_num_seqs
    ) as llm:
        outputs = _tokens(llm.chat(_chats(rows), _greedy(), use_tqdm=False))
        stats = speculation(llm)
        lookup_only = assert_both_sources_drafted_and_were_accepted(llm, stats)
        after_bookkeeping = llm.collective_rpc(_drafts_after_bookkeeping)
        rested = sum(llm.collective_rpc(_rested))
    assert outputs == [vanilla[i] for i in rows]
    if max_num_seqs == 1:  # steps whose one request copies skip the head loop
        assert lookup_only > 0
    if variant == "clover2":  # ... and the block's pass, except at a step with prompt tokens
        assert 0 < rested <= lookup_only, (rested, lookup_only)
    else:  # the reference heads have no Augmenting Block: nothing to rest
        assert rested == 0
    if variant == "after":  # as the engine resolved it: vLLM then drafts after bookkeeping
        assert after_bookkeeping == [True]
    if variant == "goodput":
        assert len(stats.steps_by_k) > 1, stats  # the budget varied K
    assert_clover_speculated(stats, k=4)  # lookup chains shorter than K cut some short


def test_prefix_caching_chunked_prefill_preemption_and_aborts_at_once(reference_target, vanilla):
    """A tiny KV cache (preemption), a small token budget (every prompt chunked), prefix
    caching (a second pass over the same prompts hits), and five requests aborted mid-way:
    the others' outputs equal vanilla's, in both passes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_target)
    prompts = []
    for chat in _chats(range(16)):
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(getattr(ids, "input_ids", ids))})
    params = [_greedy()] * 16
    aborted = [str(i) for i in range(0, 16, 3)]
    settings = dict(max_num_seqs=16, block_size=32, num_gpu_blocks_override=12)
    settings.update(enable_chunked_prefill=True, max_num_batched_tokens=32, max_model_len=256)
    with in_process_llm(
        reference_target, speculative_config=_spec(), enable_prefix_caching=True, **settings
    ) as llm:
        finished, _ = run_with_aborts(llm, prompts, params, aborted, 5)
        outputs = _tokens(llm.generate(prompts, params, use_tqdm=False))  # cached prefixes
        preemptions = metric_total(llm, "vllm:num_preemptions")
        hits = metric_total(llm, "vllm:prefix_cache_hits")
        stats = speculation(llm)
        assert_both_sources_drafted_and_were_accepted(llm, stats)
    kept = [i for i in range(16) if str(i) not in aborted]
    assert {i: finished[i] for i in kept} == {i: vanilla[i] for i in kept}
    assert outputs == vanilla
    assert preemptions > 0 and hits > 0 and 0 < stats.max_step_tokens <= 32


# T = 1: a prompt the target's answers copy from, so that the lookup drafts at T > 0 too.
SAMPLED_PROMPT = [{"role": "user", "content": "List some animals: cat, dog, bird, fish, cow."}]
NUM_SAMPLES = 600


def _sample(llm, first_seed: int, temperature: float) -> list[list[int]]:
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=temperature, max_tokens=4, seed=first_seed + i, ignore_eos=True)
        for i in range(NUM_SAMPLES)
    ]
    outputs = llm.chat([SAMPLED_PROMPT] * NUM_SAMPLES, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _p_values(a, b) -> list[float]:
    return [chi_square_homogeneity([s[i] for s in a], [s[i] for s in b])[2] for i in (1, 2, 3)]


def test_samples_at_t1_follow_the_target_distribution(reference_target):
    """Tokens 2-4 (produced by verification) of 600 samples each: hybrid against vanilla at
    T = 1 (p > ALPHA / 3 per position), and, the control, vanilla T = 1 against T = 0.8
    (rejected), with lookup chains drafted at T > 0 (one-hot draft distributions) and
    Clover's drawn ones both accepted."""
    engine = {"max_num_seqs": 64, "block_size": 32}
    with in_process_llm(reference_target, **engine) as llm:
        vanilla, cooler = _sample(llm, 0, 1.0), _sample(llm, 0, 0.8)
    spec = _spec(lookup={"min_n": 1, "max_n": 4}, num_speculative_tokens=3)
    with in_process_llm(reference_target, speculative_config=spec, **engine) as llm:
        hybrid = _sample(llm, NUM_SAMPLES, 1.0)
        stats = speculation(llm)
        assert_both_sources_drafted_and_were_accepted(llm, stats)
    assert min(_p_values(vanilla, cooler)) < ALPHA  # the test can tell T = 0.8 from 1
    assert min(_p_values(vanilla, hybrid)) > ALPHA / 3  # Bonferroni over three positions
