"""StepCostModel: the goodput budget's step-cost fit recovers known costs, keeps its prices
>= 0 and f non-decreasing, and is not set by the jitter of long prefill steps."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_clover.budget.goodput import GoodputConfig
from vllm_clover.budget.step_cost import StepCostModel, cost_knots

pytestmark = pytest.mark.unit


def test_cost_knots_double_up_to_the_largest_step():
    assert cost_knots(8).tolist() == [1, 2, 4, 8]
    assert cost_knots(5).tolist() == [1, 2, 4, 8]


def test_cost_model_recovers_a_known_linear_cost():
    config = GoodputConfig(max_k=4, max_tokens=256, cost_memory=1.0)
    model = StepCostModel(config)
    rng = random.Random(1)
    for _ in range(400):
        tokens, k, batch = rng.randint(1, 256), rng.randint(0, 4), rng.randint(1, 64)
        model.observe(
            0.01 + 0.001 * tokens + 0.002 * (k > 0) + k * (0.003 + 0.0002 * batch), tokens, k, batch
        )
    *_, g, c, e = model.knot_values()
    assert (g, c, e) == pytest.approx((0.002, 0.003, 0.0002), rel=0.05)
    assert model.predict(100, 0, 16) == pytest.approx(0.11, rel=0.02)


def test_long_prefill_steps_do_not_set_the_price_of_drafting():
    """As an engine starts: the warm-up cycle's K = 4, 0, 3, 1, 2 land on long prefill steps
    (300 tokens, 10% jitter), then decode steps of 4 requests follow, mostly at K = 0, where
    drafting truly costs 4 ms at K = 1 (3% jitter). Fitted on relative errors, the prefill
    steps' jitter (30 ms) does not swamp the decode steps' price of drafting."""
    rng = random.Random(3)
    model = StepCostModel(GoodputConfig(max_k=4, max_tokens=2048))
    jitter = [0.9, 1.1, 0.9, 1.1, 0.9]  # prefill step times, as they came, with their K
    for k, factor in zip((4, 0, 3, 1, 2), jitter, strict=True):
        model.observe(0.3 * factor, 300, k, 4)
    for step in range(250):
        k, tokens = (1, 4) if step % 16 == 0 else (0, 4)
        true = 0.040 + 0.004 * k + 0.0015 * (tokens - 4)
        model.observe(true * (1 + 0.03 * (2 * rng.random() - 1)), tokens, k, 4)
    drafting = model.predict(4, 1, 4) - model.predict(4, 0, 4)
    assert drafting == pytest.approx(0.004, rel=0.25)
    assert model.predict(4, 0, 4) == pytest.approx(0.040, rel=0.02)


def test_drafting_prices_are_never_negative_and_f_never_falls():
    """Step times that fall with K (noise, a lucky run) must not make drafting look free
    money, nor a noisy knot make more tokens look cheaper: the fit pins those to 0."""
    model = StepCostModel(GoodputConfig(max_k=2, max_tokens=16, cost_memory=1.0))
    for tokens in range(1, 17):
        for k in range(3):
            model.observe(0.05 + 0.001 * tokens - 0.002 * k, tokens, k, 4)
    model.observe(0.01, 8, 0, 8)  # an outlier: 8 tokens far faster than 4
    values = model.knot_values()
    assert (np.diff(values[: len(model.knots)]) >= 0).all()
    assert (model.coefficients() >= 0).all()
