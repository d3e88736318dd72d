"""The lr schedule, and --time-budget: the plan cut to the steps that fit, from measured step
times."""

from __future__ import annotations

import math

import pytest

from vllm_clover.training.schedule import (
    PROBE_STEPS,
    RECHECK_STEPS,
    SKIP_STEPS,
    TimeBudget,
    fit_steps,
    lr_factor,
)

pytestmark = pytest.mark.unit


def test_fit_steps_worked_example() -> None:
    assert fit_steps(10, 2.0, 470.0, 0.9) == 221
    assert fit_steps(10, 2.0, -5.0, 0.9) == 11  # out of time: one more step, then finish
    assert fit_steps(0, 1.0, 0.5, 1.0) == 1


class FakeClock:
    """Start-up takes ``startup`` seconds, then every step ``per_step``."""

    def __init__(self, startup: float, per_step: float) -> None:
        self.now, self.per_step = startup, per_step

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.per_step


def run_budget(budget: TimeBudget, clock: FakeClock, planned: int, start: int = 0) -> list[int]:
    """The plan length after every step of a loop that honours the cuts."""
    lengths, length, step = [], planned, start
    while step < length:
        clock.step()
        step += 1
        length = budget.plan_length(step, step - start, length)
        lengths.append(length)
    return lengths


def test_budget_cuts_once_at_the_probe_and_the_run_ends_in_time() -> None:
    clock = FakeClock(startup=80.0, per_step=2.0)
    budget = TimeBudget(600.0, started=0.0, clock=clock)
    lengths = run_budget(budget, clock, planned=1000)
    # timed from step SKIP_STEPS to PROBE_STEPS: 2 s a step, 100 s gone at the probe
    assert lengths[: PROBE_STEPS - 1] == [1000] * (PROBE_STEPS - 1)
    assert lengths[PROBE_STEPS - 1] == fit_steps(PROBE_STEPS, 2.0, 570.0 - 100.0, 0.9) == 221
    assert lengths[-1] == 221 and len(lengths) == 221
    assert clock.now <= 600.0 * 0.95  # ends before the reserve for evaluation and saving


def test_budget_leaves_a_plan_that_fits_and_cuts_again_on_slowdown() -> None:
    clock = FakeClock(startup=10.0, per_step=1.0)
    budget = TimeBudget(1000.0, started=0.0, clock=clock)
    assert run_budget(budget, clock, planned=300)[-1] == 300  # 310 s of 950: no cut
    clock = FakeClock(startup=10.0, per_step=1.0)
    budget = TimeBudget(1000.0, started=0.0, clock=clock)
    lengths, length, step = [], 2000, 0
    while step < length:
        clock.step()
        if step == PROBE_STEPS + 5:
            clock.per_step = 4.0  # steps get 4x slower after the first estimate
        step += 1
        length = budget.plan_length(step, step, length)
        lengths.append(length)
    first = lengths[PROBE_STEPS - 1]
    assert first == fit_steps(PROBE_STEPS, 1.0, 950.0 - 20.0, 0.9)
    assert lengths[PROBE_STEPS + RECHECK_STEPS - 1] < first  # the recheck cut further
    assert clock.now <= 1000.0


def test_no_budget_or_a_resumed_run_times_its_own_steps() -> None:
    clock = FakeClock(startup=0.0, per_step=5.0)
    assert run_budget(TimeBudget(None, 0.0, clock), clock, planned=40)[-1] == 40
    clock = FakeClock(startup=30.0, per_step=1.0)
    budget = TimeBudget(100.0, started=0.0, clock=clock)
    lengths = run_budget(budget, clock, planned=500, start=200)  # resumed at step 200
    assert lengths[PROBE_STEPS - 1] == fit_steps(200 + PROBE_STEPS, 1.0, 95.0 - 40.0, 0.9)
    assert budget.mark == (200 + SKIP_STEPS, 30.0 + SKIP_STEPS)


def test_lr_schedule_warmup_then_cosine() -> None:
    values = [lr_factor(s, 10, 2) for s in range(10)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert math.isclose(values[6], 0.5) and values[9] < 0.05
    assert all(a >= b for a, b in zip(values[1:], values[2:], strict=False))
