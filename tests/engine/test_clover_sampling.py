"""Temperature 1, plain and with top-k / top-p: Clover leaves the sampling distribution unchanged.

vLLM verifies Clover's drafts with rejection sampling (argmax drafts treated as one-hot, drawn
ones against the distribution they were drawn from), which is exact: the tokens it emits
follow the target's distribution. We check this empirically.
The first generated token comes from the prompt's prefill (no drafts), so the test looks at
tokens 2 and 3, the first ones produced by verification. For each position, a chi-square
homogeneity test compares Clover's samples with vanilla samples (N each, independent seeds);
categories with fewer than 10 expected counts are pooled.

Power: the same test, same N, must reject vanilla T=1 against vanilla T=0.8 (a total
variation distance of about 0.1 on these tokens; T=0.7 with top-k / top-p, see
CONTROL_TEMPERATURE), for each sampler; it is run here as a control, so a test that cannot
fail would fail that control. Seeds are fixed: the verdict is reproducible. Each shipped Clover
configuration is tested, the reference heads drafting a token tree, which the plugin's
multi-draft rule verifies instead of vLLM's chain sampler, and the reference heads drawing
their drafts from their own distributions (draft_sample_method "probabilistic", Clover's
default for chains), which vLLM verifies with those distributions instead of as one-hot
drafts; the shipped configurations are tested with argmax drafts ("greedy").
"""

from collections import Counter

import pytest
import torch
from spec_checks import (
    TEST_TREE,
    assert_clover_speculated,
    assert_trees_verified,
    drawn_drafts,
    speculation,
    tree_paths,
    tree_stats,
)

from helpers import in_process_llm
from vllm_clover.bundled import REFERENCE_HEADS
from vllm_clover.modeling.checkpoint import read_config_json

pytestmark = pytest.mark.engine

NUM_SAMPLES = 600
ALPHA = 0.01
# Prefilling 600 copies of the prompt is most of each engine's time. A short system turn
# makes the prompt 33 tokens (the template's default one, 39), and 32-token KV blocks (the
# CPU backend's smallest; its default, 128, is longer than the prompt) let prefix caching
# serve all but the last token (Clover-2 engines too: the token after the cached block is
# the one its draft KV was computed with; patches ledger, prefix_block_drop). Every engine
# runs with the same settings.
PROMPT = [
    {"role": "system", "content": "You are a storyteller who tells short stories."},
    {"role": "user", "content": "Tell me a short story about a dragon."},
]
ENGINE = {"max_num_seqs": 64, "block_size": 32}
# Three tokens are sampled, so positions 1 and 2 come from verifying the first two drafts of a
# step; deeper drafts would be verified and cut off by max_tokens. Clover drafts two tokens
# (and the tree is TEST_TREE's first two levels): the same test, with half the verification.
SAMPLED_DRAFTS = 2
SAMPLED_PATHS = [path for path in tree_paths(TEST_TREE) if len(path) <= SAMPLED_DRAFTS]
SAMPLED_TREE = str(SAMPLED_PATHS)  # "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]"


def chi_square_homogeneity(a: list[int], b: list[int], min_expected: float = 10.0):
    """Two-sample chi-square test on categorical samples: (statistic, dof, p-value).

    Rare categories (expected count < min_expected in either sample) are pooled into one.
    Example: a = [1, 1, 2], b = [1, 2, 2] -> tables {1: (2, 1), 2: (1, 2)}.
    """
    count_a, count_b = Counter(a), Counter(b)
    n_a, n_b = len(a), len(b)
    total = n_a + n_b
    table, pooled = [], [0, 0]
    for category in set(count_a) | set(count_b):
        row = [count_a[category], count_b[category]]
        expected_min = sum(row) * min(n_a, n_b) / total
        if expected_min < min_expected:
            pooled = [pooled[0] + row[0], pooled[1] + row[1]]
        else:
            table.append(row)
    if sum(pooled):
        table.append(pooled)
    observed = torch.tensor(table, dtype=torch.float64)  # (categories, 2)
    expected = observed.sum(1, keepdim=True) * torch.tensor([n_a, n_b]) / total
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = len(table) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))
    return statistic, dof, p_value


# Sampling settings whose output distribution must not change with Clover, and for each the
# power control: the same settings at a lower temperature, which the test must tell apart from
# T = 1. With top-k and top-p the truncation already removes the tail that T = 0.8 shrinks, and
# 600 samples do not separate T = 0.8 from T = 1 there (p = 0.03); T = 0.7 is rejected.
SAMPLERS = {"plain": {}, "top_k_top_p": {"top_k": 20, "top_p": 0.9}}
CONTROL_TEMPERATURE = {"plain": 0.8, "top_k_top_p": 0.7}


def _sample(llm, first_seed: int, temperature: float = 1.0, **sampler) -> list[list[int]]:
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=temperature, max_tokens=3, seed=first_seed + i, **sampler)
        for i in range(NUM_SAMPLES)
    ]
    outputs = llm.chat([PROMPT] * NUM_SAMPLES, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def vanilla_samples(reference_target) -> dict[str, tuple[list, list]]:
    """sampler -> (vanilla samples at T = 1, the power control's at a lower temperature)."""
    with in_process_llm(reference_target, **ENGINE) as llm:
        return {
            name: (
                _sample(llm, 0, 1.0, **sampler),
                _sample(llm, 0, CONTROL_TEMPERATURE[name], **sampler),
            )
            for name, sampler in SAMPLERS.items()
        }


@pytest.fixture(scope="module")
def clover_samples(reference_target, shipped_heads) -> tuple[dict[str, list], object]:
    """sampler -> Clover's samples at T = 1 (seeds disjoint from vanilla's) with argmax
    drafts, verified as one-hot ones, and the engine's speculation."""
    k = min(SAMPLED_DRAFTS, read_config_json(shipped_heads)["num_heads"])
    spec = {"method": "clover", "model": str(shipped_heads), "num_speculative_tokens": k}
    spec["draft_budget"] = "fixed"  # drafts at every step, at batch 64 too: the test's power
    spec["draft_sample_method"] = "greedy"  # drawn drafts (the default): drawn_samples
    with in_process_llm(reference_target, speculative_config=spec, **ENGINE) as llm:
        samples = {name: _sample(llm, NUM_SAMPLES, 1.0, **s) for name, s in SAMPLERS.items()}
        return samples, speculation(llm), k


@pytest.fixture(scope="module")
def tree_samples(reference_target) -> tuple[dict[str, list], object, object]:
    """The same with the reference heads drafting a tree (verified by the plugin's
    multi-draft rule instead of vLLM's chain sampler), and the engine's tree counters."""
    spec = {"method": "clover", "model": str(REFERENCE_HEADS)}
    spec["speculative_token_tree"] = SAMPLED_TREE
    with in_process_llm(reference_target, speculative_config=spec, **ENGINE) as llm:
        samples = {name: _sample(llm, 2 * NUM_SAMPLES, 1.0, **s) for name, s in SAMPLERS.items()}
        return samples, speculation(llm), tree_stats(llm)


def _count_verified_with_probs(worker) -> None:
    """Count the rejection sampler's calls that get draft probabilities, by a hook on it."""
    sampler = worker.model_runner.rejection_sampler
    sampler.calls_with_probs = 0

    def count(module, args) -> None:
        module.calls_with_probs += args[1] is not None  # forward(metadata, draft_probs, ...)

    sampler.register_forward_pre_hook(count)


def _verified_with_probs(worker) -> int:
    return worker.model_runner.rejection_sampler.calls_with_probs


@pytest.fixture(scope="module")
def drawn_samples(reference_target) -> tuple[dict[str, list], object, int, int]:
    """The same with the reference heads' drafts drawn from their distributions, which a
    chain does when draft_sample_method is not given (seeded requests draw with their own
    generators), K = SAMPLED_DRAFTS at every step (the test's power); the requests drawn
    for, and the verification steps that got those distributions. (Drawn drafts verified
    as one-hot ones would follow the target's distribution too, accepted less often: only
    the count shows the rule.)"""
    spec = {"method": "clover", "model": str(REFERENCE_HEADS)}
    spec.update(num_speculative_tokens=SAMPLED_DRAFTS, draft_budget="fixed")
    with in_process_llm(reference_target, speculative_config=spec, **ENGINE) as llm:
        llm.collective_rpc(_count_verified_with_probs)
        samples = {name: _sample(llm, 3 * NUM_SAMPLES, 1.0, **s) for name, s in SAMPLERS.items()}
        (with_probs,) = llm.collective_rpc(_verified_with_probs)
        return samples, speculation(llm), drawn_drafts(llm), with_probs


def _p_values(a, b):
    return [chi_square_homogeneity([s[pos] for s in a], [s[pos] for s in b])[2] for pos in (1, 2)]


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_the_test_detects_a_small_change_of_temperature(vanilla_samples, sampler):
    at_one, cooler = vanilla_samples[sampler]
    assert min(_p_values(at_one, cooler)) < ALPHA


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_clover_samples_follow_the_target_distribution(vanilla_samples, clover_samples, sampler):
    """T = 1, and T = 1 with top-k and top-p (vLLM applies them to the target's distribution
    at every verified position): Clover's samples are distributed as vanilla's."""
    samples, stats, k = clover_samples
    assert_clover_speculated(stats, k=k)
    p_values = _p_values(vanilla_samples[sampler][0], samples[sampler])
    assert min(p_values) > ALPHA / 2, p_values  # Bonferroni over the two positions


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_tree_samples_follow_the_target_distribution(vanilla_samples, tree_samples, sampler):
    """T = 1 (and with top-k, top-p) with a token tree: the samples are distributed as
    vanilla's, and paths off the rank-0 chain were accepted (the multi-draft rule at work)."""
    samples, stats, trees = tree_samples
    assert_trees_verified(trees, len(SAMPLED_PATHS), stats)
    p_values = _p_values(vanilla_samples[sampler][0], samples[sampler])
    assert min(p_values) > ALPHA / 2, p_values


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_drawn_drafts_leave_the_target_distribution(vanilla_samples, drawn_samples, sampler):
    """T = 1 (and with top-k, top-p) with drafts drawn from the heads' distributions (the
    default): vLLM verifies them against those distributions (min(1, p/q), then
    max(p - q, 0)), and the samples are distributed as vanilla's; drafts were drawn and
    accepted."""
    samples, stats, drawn, with_probs = drawn_samples
    assert drawn > 0 and with_probs > 0, (drawn, with_probs)  # drawn, verified with q
    assert_clover_speculated(stats, k=SAMPLED_DRAFTS)
    p_values = _p_values(vanilla_samples[sampler][0], samples[sampler])
    assert min(p_values) > ALPHA / 2, p_values


def test_chi_square_on_known_tables():
    same = [0] * 50 + [1] * 50
    assert chi_square_homogeneity(same, same)[2] == pytest.approx(1.0)
    statistic, dof, p_value = chi_square_homogeneity([0] * 80 + [1] * 20, [0] * 50 + [1] * 50)
    assert dof == 1 and statistic == pytest.approx(19.78, abs=0.01) and p_value < 1e-4
