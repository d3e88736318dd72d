"""The fitting math under the goodput budget's `StepCostModel` (``step_cost.py``).

A step's time is a piecewise-linear function of its scheduled tokens, so the model's features
are hat functions on knots (`hats`), a prior keeps the function linear where no step has
measured it (`curvature_penalty`), and the fit holds every coefficient >= 0
(`nonnegative_least_squares`). Pure NumPy. How it works: docs/design/drafting.md, "The
step-cost model".
"""

from __future__ import annotations

import numpy as np


def hats(knots: np.ndarray, tokens: float) -> np.ndarray:
    """Linear-interpolation weights of `tokens` on `knots` (extrapolating at the ends)."""
    x = float(min(max(tokens, knots[0]), 4 * knots[-1]))
    j = int(np.clip(np.searchsorted(knots, x) - 1, 0, len(knots) - 2))
    w = (x - knots[j]) / (knots[j + 1] - knots[j])
    hats = np.zeros(len(knots))
    hats[j], hats[j + 1] = 1 - w, w
    return hats


def curvature_penalty(knots: np.ndarray, size: int) -> np.ndarray:
    """P with f^T P f = sum_j (x_j * slope change at knot j)^2: zero for f linear in N, so a
    knot no step has reached is extrapolated linearly from its neighbours."""
    rows = []
    for j in range(1, len(knots) - 1):
        left, right = 1 / (knots[j] - knots[j - 1]), 1 / (knots[j + 1] - knots[j])
        row = np.zeros(size)
        row[j - 1 : j + 2] = knots[j] * np.array([left, -(left + right), right])
        rows.append(row)
    diff = np.array(rows)
    ridge = 1e-6 * np.eye(size)  # keeps every coefficient determined before any data
    return diff.T @ diff + ridge


def nonnegative_least_squares(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} x^T gram x - 2 rhs^T x (Lawson-Hanson's active set, on the normal
    equations): coefficients that would go negative are held at 0 and the rest refitted."""
    size = len(rhs)
    passive = np.zeros(size, dtype=bool)  # the coefficients free to be > 0
    x = np.zeros(size)
    for _ in range(3 * size):
        gradient = rhs - gram @ x
        candidates = np.where(~passive & (gradient > 1e-12))[0]
        if len(candidates) == 0:
            break
        passive[candidates[np.argmax(gradient[candidates])]] = True
        while True:
            z = np.zeros(size)
            z[passive] = np.linalg.solve(gram[np.ix_(passive, passive)], rhs[passive])
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + step * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x
