"""The step-cost half of the goodput budget (``goodput.py``): what a step of N scheduled
tokens costs when it drafts K per request for B of them, learnt online from measured steps.
The fitting math is in ``piecewise_fit.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vllm_clover.budget.piecewise_fit import (
    curvature_penalty,
    hats,
    nonnegative_least_squares,
)

if TYPE_CHECKING:  # goodput.py imports this module; the config is only annotated here
    from vllm_clover.budget.goodput import GoodputConfig

DRAFT_TERMS = 3  # g, c, e: the prices after the knots' values


def cost_knots(max_tokens: int) -> np.ndarray:
    """Token counts where f is a free value: 1, 2, 4, ... up to the first >= max_tokens."""
    top = max(1, int(np.ceil(np.log2(max(max_tokens, 2)))))
    return 2.0 ** np.arange(top + 1)


class StepCostModel:
    """Step time as f(tokens) + g [K > 0] + c K + e K B in seconds, fitted online: f piecewise
    linear on the knots, f_j = f_0 + delta_1 + ... + delta_j with every coefficient >= 0, on
    relative errors (weights 1 / seconds^2). Why: docs/design/drafting.md, "The step-cost
    model"."""

    def __init__(self, config: GoodputConfig) -> None:
        self.config = config
        self.knots = cost_knots(config.max_tokens)
        size = len(self.knots) + DRAFT_TERMS
        self.xtx = np.zeros((size, size))
        self.xty = np.zeros(size)
        # [size, size]: knot values and drafting prices from (f_0, deltas, g, c, e)
        self.to_values = np.eye(size)
        self.to_values[: len(self.knots), : len(self.knots)] = np.tril(
            np.ones((len(self.knots),) * 2)
        )
        penalty = curvature_penalty(self.knots, size)
        self.penalty = config.smoothness * self.to_values.T @ penalty @ self.to_values
        self.observations = 0
        self.weight_sum = 0.0  # forgotten like xtx; / count: the scale of the prior
        self.count = 0.0
        self._fitted_at = 0  # observations when last fitted
        self._coef: np.ndarray | None = None

    def features(self, tokens: float, k: int, batch: int) -> np.ndarray:
        x = np.zeros(len(self.knots) + DRAFT_TERMS)
        x[: len(self.knots)] = hats(self.knots, tokens)
        x[-DRAFT_TERMS:] = (1.0 if k > 0 else 0.0, k, k * batch)
        return x @ self.to_values

    def observe(self, seconds: float, tokens: int, k: int, batch: int) -> None:
        x = self.features(tokens, k, batch)
        weight = 1.0 / max(seconds, 1e-6) ** 2
        memory = self.config.cost_memory
        self.xtx = memory * self.xtx + weight * np.outer(x, x)
        self.xty = memory * self.xty + weight * seconds * x
        self.weight_sum = memory * self.weight_sum + weight
        self.count = memory * self.count + 1
        self.observations += 1

    def coefficients(self) -> np.ndarray:
        """[f_0, delta_1, ..., g, c, e], all >= 0 (refitted every `refit_every` steps)."""
        if self._coef is None or self.observations - self._fitted_at >= self.config.refit_every:
            scale = self.weight_sum / self.count if self.count else 1.0
            self._coef = nonnegative_least_squares(self.xtx + scale * self.penalty, self.xty)
            self._fitted_at = self.observations
        return self._coef

    def knot_values(self) -> np.ndarray:
        """[f at each knot, g, c, e] in seconds."""
        return self.to_values @ self.coefficients()

    def predict(self, tokens: float, k: int, batch: int) -> float:
        return float(self.features(tokens, k, batch) @ self.coefficients())
