"""Goodput-driven draft budget: how many tokens a speculative step may draft, chosen per step.

Whether speculation pays depends on the batch, the machine, the model and the acceptance rate,
which a hand-written batch-size -> K table fixes once. `GoodputController` measures them while
serving and drafts the K of the highest predicted tokens per second (0 when none beats not
drafting). Pure Python and NumPy; `patches/scheduling.py` feeds it from the scheduler.
How it works: docs/design/drafting.md, "The goodput draft budget".
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from vllm_clover.budget.step_cost import StepCostModel


@dataclass(frozen=True)
class GoodputConfig:
    """How the controller learns; the defaults suit any engine, none needs tuning."""

    max_k: int  # the most drafts per request (num_speculative_tokens)
    max_tokens: int = 8192  # the largest step (max_num_batched_tokens): the last cost knot
    explore: float = 1 / 16  # share of steps that try (or start a burst on) the best K -+ 1 ...
    explore_margin: float = 0.1  # ... if predicted within this fraction of the best goodput
    min_measured: int = 4  # ... or if fewer decode steps of this batch bucket measured that K
    optimism: float = 1.0  # z of the acceptance's upper confidence bound the choice reads
    warmup_steps: int = 0  # first decode steps cycle K = top, 0, 0, top - 1, 1, ...
    #                        (0: top + 2 steps, every K up to top once and K = 0 twice)
    warmup_tokens: int = 16  # top: max_k, or less where a step would verify more tokens
    cost_memory: float = 0.998  # per-step forgetting of the cost fit (about 500 steps)
    acceptance_memory: float = 0.995  # forgetting per step that verifies drafts
    smoothness: float = 1e-3  # weight of the prior that f is linear between knots
    refit_every: int = 4  # steps between refits of the cost model
    seed: int = 0  # exploration is pseudo-random, reproducible per engine
    quiet_after: int = 64  # K = 0 choices in a row at one batch bucket before saying so

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"goodput draft budget needs max_k >= 1, got {self.max_k}")
        if not 0 <= self.explore < 1:
            raise ValueError(f"explore must be in [0, 1), got {self.explore}")

    def warmup_top(self, batch: int) -> int:
        """The largest K the warm-up tries at `batch` requests (max_k 4, 16 tokens: batch
        1 -> 4, 4 -> 3, 8+ -> 1; why: docs/design/drafting.md, "Warm-up")."""
        return min(self.max_k, max(1, self.warmup_tokens // batch - 1))

    def warmup(self, batch: int) -> int:
        return self.warmup_steps or self.warmup_top(batch) + 2


class AcceptanceModel:
    """a_i and d_i per draft position from the verified drafts, with exponential forgetting:
    a_i = p_0 * p_1 * ... * p_i, p_i the share of the drafts that reached position i that were
    accepted there, with a prior of one request at p_{i-1}. Only steps that verify drafts
    forget. Why, with a worked example: docs/design/drafting.md, "Acceptance as a chain"."""

    def __init__(self, config: GoodputConfig) -> None:
        self.memory = config.acceptance_memory
        self.offered = np.ones(config.max_k)
        self.drafted = np.ones(config.max_k)
        self.reached = np.zeros(config.max_k)
        self.accepted = np.zeros(config.max_k)
        self.reached[0], self.accepted[0] = 1.0, 0.5  # p_0's prior; the others follow it

    def observe(self, verified: list[tuple[int, int, int]]) -> None:
        """verified: (offered k, drafted n, accepted m) for each request of one step."""
        if not any(offered for offered, _, _ in verified):
            return
        for counts in (self.offered, self.drafted, self.reached, self.accepted):
            counts *= self.memory
        for offered, drafted, accepted in verified:
            self.offered[:offered] += 1
            self.drafted[:drafted] += 1
            self.reached[: min(offered, accepted + 1)] += 1
            self.accepted[:accepted] += 1

    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, d): per position, accepted (the chain of p_i) and drafted per request offered
        that position."""
        return np.cumprod(self._conditional()), self.drafted / self.offered

    def _conditional(self) -> np.ndarray:
        """p_i: accepted per draft that reached position i, each p_i (i > 0) with one
        request's prior at p_{i-1} (p_0's prior is in its counts)."""
        p = np.empty_like(self.accepted)
        p[0] = min(self.accepted[0] / self.reached[0], 1.0)
        for i in range(1, len(p)):
            p[i] = min((self.accepted[i] + p[i - 1]) / (self.reached[i] + 1.0), 1.0)
        return p

    def optimistic_rates(self, z: float) -> tuple[np.ndarray, np.ndarray]:
        """(a+, d): a with p_0 at its Wilson upper bound (z standard errors over the
        forgotten counts), the later p_i at their means; d as in ``rates``. Why p_0 alone,
        with examples: docs/design/drafting.md, "The optimistic first position"."""
        p, n = self._conditional(), self.reached[0]
        centre = p[0] + z**2 / (2 * n)
        spread = z * np.sqrt(p[0] * (1 - p[0]) / n + z**2 / (4 * n**2))
        p[0] = min((centre + spread) / (1 + z**2 / n), 1.0)  # the later p_i keep the mean's prior
        return np.cumprod(p), self.drafted / self.offered


@dataclass
class BudgetLog:
    """The controller's decisions (diagnostics, tests and the periodic log line)."""

    chosen: Counter[tuple[int, int]] = field(default_factory=Counter)  # (batch, K) -> steps
    explored: Counter[int] = field(default_factory=Counter)  # K -> steps tried next to best
    warmup: Counter[int] = field(default_factory=Counter)  # K -> steps of the warm-up cycle

    def k_by_batch(self) -> dict[int, dict[int, int]]:
        """{batch: {K: steps}} of the decisions the model made (warm-up and exploration
        excluded)."""
        table: dict[int, dict[int, int]] = {}
        for (batch, k), steps in sorted(self.chosen.items()):
            table.setdefault(batch, {})[k] = steps
        return table


class GoodputController:
    """Chooses each step's K (`choose`) and learns from each step's outcome (`observe_step`)."""

    def __init__(self, config: GoodputConfig) -> None:
        self.config = config
        self.cost = StepCostModel(config)
        self.acceptance = AcceptanceModel(config)
        self.log = BudgetLog()
        # (batch_bucket(batch), K) -> decode steps run
        self.measured: Counter[tuple[int, int]] = Counter()
        self.steps = 0  # choices made
        self.decode_steps = 0  # steps observed that verified (decoded) at least one request
        self.last_k = config.max_k  # the K of the step observed last (its drafts verify next)
        self._random = random.Random(config.seed)
        self._trial: tuple[int, int] | None = None  # (bucket, K) of the burst under way
        self._trial_steps_left = 0  # ... ends after this many steps even if still unmeasured
        self._rest_again: int | None = None  # the bucket of a close call of K = 0 just tried
        self._idle: Counter[int] = Counter()  # batch bucket -> K = 0 choices in a row
        self.notices: list[str] = []  # lines to log once, taken by the scheduler's patch

    def choose(self, batch: int, prefill: bool = False) -> int:
        """The K for a step of `batch` requests: a step of the warm-up cycle, an exploration
        (``_explore``), or the K of the highest predicted goodput. A step that carries prompt
        tokens (`prefill`) never explores: the model does not predict its drafting price."""
        self.steps += 1
        if self.decode_steps < self.config.warmup(batch):  # prefill alone does not advance it
            k = _warmup_k(self.decode_steps, self.config.warmup_top(batch))
            self.log.warmup[k] += 1
            return k
        goodput = self.predicted_goodput(batch)
        best = int(np.argmax(goodput))
        tried = None if prefill else self._explore(batch, best, goodput)
        if tried is None:
            self.log.chosen[(batch, best)] += 1
            self._note_idle(batch, best)
            return best
        self.log.explored[tried] += 1
        return tried

    def _note_idle(self, batch: int, best: int) -> None:
        """Queue one notice the first time a batch bucket has chosen K = 0 `quiet_after`
        times in a row: the user should know why speculation is not speeding anything up."""
        bucket = batch_bucket(batch)
        self._idle[bucket] = self._idle[bucket] + 1 if best == 0 else 0
        if self._idle[bucket] == self.config.quiet_after:
            low = bucket // 2 + 1 if bucket > 2 else bucket
            sizes = f"{low}-{bucket}" if low < bucket else f"{bucket}"
            self.notices.append(
                f"drafting does not pay at {sizes} requests a step on this machine with "
                f"these heads (K = 0 for {self.config.quiet_after} steps in a row); the budget "
                "drafts there only to re-check now and then"
            )

    def _explore(self, batch: int, best: int, goodput: np.ndarray) -> int | None:
        """The K to try instead of `best` this step, if any: the next step of a burst on an
        unmeasured K, or (one step in 1 / explore) a neighbour that is unmeasured, which
        starts a burst, or a close call; a close call of K = 0 holds for two steps. Examples
        and why: docs/design/drafting.md, "Exploration"."""
        bucket = batch_bucket(batch)
        rest_again, self._rest_again = self._rest_again, None
        if rest_again == bucket and best != 0:
            return 0
        if self._trial is not None:
            trial_bucket, trial_k = self._trial
            self._trial_steps_left -= 1
            unmeasured = self.measured[self._trial] < self.config.min_measured
            if trial_bucket == bucket and trial_k != best and unmeasured and self._trial_steps_left:
                return trial_k
            self._trial = None
        if self._random.random() >= self.config.explore:
            return None
        near = self._neighbour(best, bucket)
        if self.measured[(bucket, near)] < self.config.min_measured:
            # a prefill step does not measure, so the burst gets twice its length in steps
            self._trial, self._trial_steps_left = (bucket, near), 2 * self.config.min_measured
            return near
        if goodput[near] >= (1 - self.config.explore_margin) * goodput[best]:
            self._rest_again = bucket if near == 0 else None
            return near
        return None

    def _neighbour(self, best: int, bucket: int) -> int:
        """best - 1 or best + 1 within 0..max_k, at random among those that fewer than
        `min_measured` decode steps of this batch bucket ran, if any (why:
        docs/design/drafting.md, "Exploration")."""
        options = [k for k in (best - 1, best + 1) if 0 <= k <= self.config.max_k]
        unmeasured = [k for k in options if self.measured[(bucket, k)] < self.config.min_measured]
        return self._random.choice(unmeasured or options)

    def best_k(self, batch: int) -> int:
        """argmax_K predicted tokens per second for `batch` requests (the smallest K on ties)."""
        goodput = self.predicted_goodput(batch)
        return int(np.argmax(goodput))

    def predicted_goodput(self, batch: int) -> np.ndarray:
        """[K_max + 1] predicted tokens per second of a step with K = 0..K_max."""
        rates = self.acceptance.optimistic_rates(self.config.optimism)
        accepted, drafted = (np.concatenate(([0.0], np.cumsum(r))) for r in rates)
        goodput = np.zeros(self.config.max_k + 1)
        for k in range(self.config.max_k + 1):
            seconds = self.cost.predict(batch * (1 + drafted[k]), k, batch)
            goodput[k] = batch * (1 + accepted[k]) / max(seconds, 1e-6)
        return goodput

    def observe_step(
        self,
        seconds: float,
        tokens: int,
        k: int,
        batch: int,
        verified: list[tuple[int, int]],
    ) -> None:
        """One executed step: its wall time, scheduled tokens, its K and batch, and for each
        request that decoded, its drafts made in the previous step (under that step's K) as
        (drafted, accepted), (0, 0) without drafts; prefill chunks are not listed."""
        self.cost.observe(seconds, tokens, k, batch)
        if verified:  # prefill alone measures no K
            self.measured[(batch_bucket(batch), k)] += 1
            self.decode_steps += 1
        self.acceptance.observe([(self.last_k, n, m) for n, m in verified])
        self.last_k = k

    def summary(self) -> str:
        """One log line: per-position acceptance, and the K the model would pick by batch."""
        accepted, drafted = self.acceptance.rates()
        picks = {b: self.best_k(b) for b in (1, 2, 4, 8, 16, 32, 64)}
        return (
            f"accepted per position {np.round(accepted, 3).tolist()}, drafted "
            f"{np.round(drafted, 3).tolist()}; K by batch size {picks}"
        )


def batch_bucket(batch: int) -> int:
    """The power of two at or above `batch`: 1, 2, 4, 4, 8, ... (5..8 -> 8, 33..64 -> 64)."""
    return 1 << max(0, batch - 1).bit_length()


def _warmup_k(step: int, max_k: int) -> int:
    """max_k, 0, 0, max_k - 1, 1, max_k - 2, ... : the extremes first, so both ends of the
    cost are seen, and K = 0 twice, since only the second prices a step that neither
    verifies nor drafts (docs/design/drafting.md, "Warm-up")."""
    i = step % (max_k + 2)
    if i < 3:
        return (max_k, 0, 0)[i]
    i -= 1  # max_k - 1, 1, max_k - 2, 2, ...
    return max_k - i // 2 if i % 2 == 0 else i // 2
