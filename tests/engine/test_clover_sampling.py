"""Temperature 1: Clover leaves the sampling distribution unchanged.

vLLM verifies Clover's drafts with rejection sampling (draft treated as one-hot), which is
exact: the tokens it emits follow the target's distribution. We check this empirically.
The first generated token comes from the prompt's prefill (no drafts), so the test looks at
tokens 2 and 3, the first ones produced by verification. For each position, a chi-square
homogeneity test compares Clover's samples with vanilla samples (N each, independent seeds);
categories with fewer than 10 expected counts are pooled.

Power: the same test, same N, must reject vanilla T=1 against vanilla T=0.8 (a total
variation distance of about 0.1 on these tokens); it is run here as a control, so a test that
cannot fail would fail that control. Seeds are fixed: the verdict is reproducible.
"""

from collections import Counter

import pytest
import torch

from helpers import in_process_llm

pytestmark = pytest.mark.engine

NUM_SAMPLES = 600
ALPHA = 0.01
PROMPT = [{"role": "user", "content": "Tell me a short story about a dragon."}]


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


def _sample(llm, temperature: float, first_seed: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = [
        SamplingParams(temperature=temperature, max_tokens=3, seed=first_seed + i)
        for i in range(NUM_SAMPLES)
    ]
    outputs = llm.chat([PROMPT] * NUM_SAMPLES, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def vanilla_samples(reference_target):
    with in_process_llm(reference_target, max_num_seqs=64) as llm:
        return {1.0: _sample(llm, 1.0, 0), 0.8: _sample(llm, 0.8, 0)}


def _p_values(a, b):
    return [chi_square_homogeneity([s[pos] for s in a], [s[pos] for s in b])[2] for pos in (1, 2)]


def test_the_test_detects_a_small_change_of_temperature(vanilla_samples):
    assert min(_p_values(vanilla_samples[1.0], vanilla_samples[0.8])) < ALPHA


def test_clover_samples_follow_the_target_distribution(
    reference_target, clover_heads, vanilla_samples
):
    spec = {"method": "clover", "model": str(clover_heads), "num_speculative_tokens": 4}
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=64, disable_log_stats=False
    ) as llm:
        clover = _sample(llm, 1.0, NUM_SAMPLES)  # seeds disjoint from the vanilla ones
        drafts = sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_drafts")
    assert drafts > 0
    p_values = _p_values(vanilla_samples[1.0], clover)
    assert min(p_values) > ALPHA / 2, p_values  # Bonferroni over the two positions


def test_chi_square_on_known_tables():
    same = [0] * 50 + [1] * 50
    assert chi_square_homogeneity(same, same)[2] == pytest.approx(1.0)
    statistic, dof, p_value = chi_square_homogeneity([0] * 80 + [1] * 20, [0] * 50 + [1] * 50)
    assert dof == 1 and statistic == pytest.approx(19.78, abs=0.01) and p_value < 1e-4
