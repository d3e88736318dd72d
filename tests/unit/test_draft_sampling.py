"""DraftSampler: drafts drawn from the heads' distributions, and the q vLLM verifies them with."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import K, V, chi_square_fit, random_clover, tiny_config
from vllm_clover.modeling.draft_sampling import DraftSampler, inverse_cdf, residual_tokens

pytestmark = pytest.mark.unit


def test_docstring_example_greedy_row_one_hot_and_scatter_to_the_target_vocabulary():
    """The worked example of docs/design/network.md, "Drafts drawn at T > 0"."""
    logits = torch.tensor([[0.0, 0.0, math.log(2)], [3.0, 1.0, 0.0]])
    sampler = DraftSampler(torch.tensor([1.0, 0.0]))
    picked = sampler.pick(logits)
    assert picked[1] == 0  # T = 0: the argmax, whatever the draw
    q = sampler.target_probs(2, torch.tensor([2, 5, 9]), 10)  # (M, steps, V)
    assert q.shape == (2, 2, 10)
    assert torch.allclose(q[0, 0, [2, 5, 9]], torch.tensor([0.25, 0.25, 0.5]))
    assert q[0, 0].sum() == pytest.approx(1.0) and q[0, 0, [0, 1, 3, 4, 6, 7, 8]].eq(0).all()
    assert q[1, 0].tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]  # one-hot at target id 2
    assert q[:, 1].eq(0).all()  # a step never drafted (every chain stopped) stays zero


def test_greedy_rows_take_the_argmax_with_a_one_hot_q_and_seeded_rows_reproduce():
    logits = torch.randn(6, 7, generator=torch.Generator().manual_seed(0))
    temperature = torch.tensor([1.0, 1.0, 0.0, 0.7, 0.0, 2.0])

    def draws(seed: int) -> list[list[int]]:
        generators = {1: torch.Generator().manual_seed(seed), 5: torch.Generator().manual_seed(9)}
        sampler = DraftSampler(temperature, generators)
        return [sampler.pick(logits).tolist() for _ in range(30)], sampler

    (first, sampler), (again, _) = draws(1), draws(1)
    assert sampler.draw_rows.tolist() == [True, True, False, True, False, True]
    for row in (2, 4):  # greedy
        assert {d[row] for d in first} == {int(logits[row].argmax())}
    assert [d[1] for d in first] == [d[1] for d in again]  # seeded: the same draws
    assert [d[5] for d in first] == [d[5] for d in again]
    assert len({d[1] for d in first}) > 1  # ... and drawn, not the argmax
    q = sampler.steps[0]
    assert torch.equal(q[[2, 4]], torch.eye(7)[logits.argmax(-1)[[2, 4]]])
    assert torch.allclose(q[3], (logits[3] / 0.7).softmax(-1))


def test_drawn_drafts_follow_the_heads_distribution_at_the_requests_temperature():
    """Chi-square fit of 4,000 draws to softmax(logits / T), and its power control: the same
    draws are rejected against the distribution at T = 1."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n, temperature = 4000, 0.6
    sampler = DraftSampler(torch.full((n,), temperature))
    draws = sampler.pick(logits.expand(n, -1))
    _, _, p_value = chi_square_fit(draws, (logits / temperature).softmax(-1))
    assert p_value > 1e-3, p_value
    _, _, p_control = chi_square_fit(draws, logits.softmax(-1))
    assert p_control < 1e-6, p_control  # the test tells T = 0.6 from T = 1


def test_head_loop_feeds_each_drawn_draft_to_the_next_head():
    """All rows greedy: the sampled loop drafts what the greedy loop does. Drawn: every
    draft is a draft-vocabulary token with q > 0 at its step, and q sums to 1 per step."""
    model, _ = random_clover(tiny_config(draft_vocab_size=40), seed=3)
    h0, t0 = torch.randn(5, model.config.hidden_size), torch.randint(0, V, (5,))
    greedy = model.heads.propose(h0, t0, K, model.tables)
    zero = DraftSampler(torch.zeros(5))
    assert torch.equal(model.heads.propose(h0, t0, K, model.tables, sampler=zero), greedy)

    sampler = DraftSampler(torch.full((5,), 1.5))
    drafts = model.heads.propose(h0, t0, K, model.tables, sampler=sampler)
    ids = model.tables.draft_vocab_ids
    q = sampler.target_probs(K, ids, V)  # (5, K, V)
    assert torch.isin(drafts, ids).all()
    assert (q.gather(2, drafts[..., None]) > 0).all()
    assert torch.allclose(q.sum(-1), torch.ones(5, K))


def test_a_confidence_stop_still_cuts_drawn_chains():
    model, _ = random_clover(tiny_config(draft_vocab_size=40), seed=3)
    h0, t0 = torch.randn(5, model.config.hidden_size), torch.randint(0, V, (5,))
    sampler = DraftSampler(torch.ones(5))
    drafts = model.heads.propose(h0, t0, K, model.tables, torch.ones(K), sampler)
    assert drafts.eq(-1).all()  # no head is ever sure: every chain stops at its first step
    assert sampler.target_probs(K, model.tables.draft_vocab_ids, V).shape == (5, K, V)


def test_residual_tokens_follow_the_docstring_example_and_skip_refused_drafts():
    """The residual's example in docs/design/network.md, "Drafts drawn at T > 0": p = [0.5, 0.3,
    0.2] with greedy draft 0 draws from [0, 0.6, 0.4]; a -1 draft (one a grammar refused) zeroes
    nothing. Chi-square fit of 4,000 draws, with its power control."""
    torch.manual_seed(0)
    n = 4000
    p = torch.tensor([0.5, 0.3, 0.2]).expand(n, -1).contiguous()
    drafts = torch.zeros(n, dtype=torch.int32)
    tokens = residual_tokens(p, None, drafts, [n], {})
    assert tokens.dtype == torch.int32 and tokens.shape == (n,)
    _, _, p_value = chi_square_fit(tokens.long(), torch.tensor([0.0, 0.6, 0.4]))
    assert p_value > 1e-3, p_value
    _, _, p_control = chi_square_fit(tokens.long(), torch.tensor([0.0, 0.5, 0.5]))
    assert p_control < 1e-6, p_control  # the test tells 0.6 / 0.4 from 0.5 / 0.5
    refused = residual_tokens(p[:n], None, torch.full((n,), -1), [n], {})
    _, _, p_value = chi_square_fit(refused, torch.tensor([0.5, 0.3, 0.2]))
    assert p_value > 1e-3, p_value


def test_residual_tokens_draw_max_p_minus_q_and_seeded_requests_reproduce():
    """Three requests with 2, 0 and 3 draft positions; q given; request 2 is seeded."""
    torch.manual_seed(1)
    p = torch.tensor([0.1, 0.4, 0.3, 0.2]).expand(5, -1).contiguous()
    q = torch.tensor([0.4, 0.1, 0.3, 0.2]).expand(5, -1).contiguous()  # residual: only 1
    drafts = torch.tensor([0, 0, 1, 2, 3])

    def tokens(seed: int) -> torch.Tensor:
        generators = {2: torch.Generator().manual_seed(seed)}
        return residual_tokens(p, q, drafts, [2, 0, 3], generators)

    assert tokens(3).tolist() == [1] * 5  # max(p - q, 0) = [0, 0.3, 0, 0]
    p_seeded = torch.rand(5, 50).softmax(-1)
    q_zero = torch.zeros(5, 50)
    draws = [
        residual_tokens(p_seeded, q_zero, drafts, [2, 0, 3], {2: torch.Generator().manual_seed(7)})
        for _ in range(2)
    ]
    assert torch.equal(draws[0][2:], draws[1][2:])  # request 2's rows: its generator's draws


def test_inverse_cdf_draws_each_row_in_proportion_to_its_weights():
    torch.manual_seed(2)
    weights = torch.tensor([[1.0, 1.0, 2.0], [0.0, 3.0, 1.0]]).repeat(2000, 1)
    draws = inverse_cdf(weights)
    for row, probs in enumerate(([0.25, 0.25, 0.5], [0.0, 0.75, 0.25])):
        _, _, p_value = chi_square_fit(draws[row::2], torch.tensor(probs))
        assert p_value > 1e-3, (row, p_value)
    assert inverse_cdf(torch.zeros(1, 4)).tolist() == [3]  # a row of zeros: the last index
