"""The learning-rate schedule over a step plan, and `train --time-budget`: after PROBE_STEPS
steps the budget times a step and cuts the plan to the steps that fit; the schedule reads
``len(plan)`` every step, so a cut run still warms up and anneals to 0.
Worked example: docs/design/training-internals.md, "Schedule and time budget".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

PROBE_STEPS = 10  # steps of this invocation before the first estimate
SKIP_STEPS = 2  # the first steps are slower (allocator, kernels' first use): not timed
RECHECK_STEPS = 50
SAFETY = 0.9  # the first cut leaves 10% of the time to spare for slower steps later
RESERVE_FRACTION = 0.05  # of the budget, for the final evaluation and checkpoint


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps to 1, then cosine to 0 at ``total``. Example
    (total 10, warmup 2): step 0 -> 0.5, 1 -> 1.0, 2 -> 1.0, 6 -> 0.5, 9 -> ~0.04."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, plan: list, warmup_fraction: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` over ``plan``, read afresh every step: when TimeBudget cuts the plan in
    place, warmup (``warmup_fraction`` of it) and the cosine follow the shorter plan."""

    def factor(step: int) -> float:
        return lr_factor(step, len(plan), max(1, round(warmup_fraction * len(plan))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fit_steps(step: int, seconds_per_step: float, seconds_left: float, safety: float) -> int:
    """The plan length that ends in time: ``step`` done plus the steps that fit, at least 1.
    Example: fit_steps(10, 2.0, 470.0, 0.9) = 221; fit_steps(10, 2.0, -5.0, 0.9) = 11."""
    more = int(seconds_left / seconds_per_step * safety) if seconds_left > 0 else 0
    return step + max(1, more)


class TimeBudget:
    """Cuts a step plan (in place) so that the run ends ``seconds`` after ``started``."""

    def __init__(
        self,
        seconds: float | None,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds, self.started, self.clock = seconds, started, clock
        self.mark: tuple[int, float] | None = None  # (step, time) where timing began

    def checks_at(self, done: int) -> bool:
        """Whether the budget looks after ``done`` steps of this invocation (same on every
        process, so that they all take part in the decision)."""
        if self.seconds is None or done < PROBE_STEPS:
            return False
        return (done - PROBE_STEPS) % RECHECK_STEPS == 0

    def plan_length(self, step: int, done: int, planned: int) -> int:
        """After ``step`` steps (``done`` of them in this invocation): the plan length that
        fits the budget, never more than ``planned``."""
        now = self.clock()
        if done == SKIP_STEPS:
            self.mark = (step, now)
        if not self.checks_at(done) or self.mark is None:
            return planned
        per_step = (now - self.mark[1]) / max(1, step - self.mark[0])
        left = self.started + self.seconds * (1 - RESERVE_FRACTION) - now
        safety = SAFETY if done == PROBE_STEPS else 1.0
        return min(planned, fit_steps(step, per_step, left, safety))
