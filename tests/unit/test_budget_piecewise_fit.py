"""The fitting math under the step-cost model (budget/piecewise_fit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_clover.budget.piecewise_fit import hats, nonnegative_least_squares

pytestmark = pytest.mark.unit


def test_knots_and_hats_interpolate_linearly():
    knots = np.array([1.0, 2.0, 4.0, 8.0])
    assert hats(knots, 3).tolist() == [0, 0.5, 0.5, 0]  # f(3) = (f(2) + f(4)) / 2
    assert hats(knots, 16).tolist() == [0, 0, -2, 3]  # f(8) + 2 (f(8) - f(4)): the line goes on


def test_nonnegative_least_squares_matches_the_unconstrained_fit_when_it_is_positive():
    rng = np.random.default_rng(0)
    a = rng.random((30, 4))
    y = a @ np.array([1.0, 2.0, 0.5, 3.0])
    assert nonnegative_least_squares(a.T @ a, a.T @ y) == pytest.approx([1.0, 2.0, 0.5, 3.0])
    y = a @ np.array([1.0, -2.0, 0.5, 3.0])  # the best x >= 0 pins the second to 0
    x = nonnegative_least_squares(a.T @ a, a.T @ y)
    assert x[1] == 0 and (x >= 0).all()
    gradient = a.T @ y - a.T @ a @ x  # KKT: no feasible direction lowers the loss
    assert np.abs(gradient[x > 0]).max() < 1e-9 and (gradient[x == 0] <= 1e-9).all()
