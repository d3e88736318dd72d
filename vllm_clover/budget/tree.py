"""Goodput for token trees: the path probability a node needs to be drafted, chosen per step.

A drafted node costs a row of the target's forward whether it is accepted or not, and yields a
token when it is. At a step of N scheduled rows that emits E tokens in T seconds, one more row
costs f'(N) seconds (the slope of the step time in N), in which the engine emits
f'(N) * E / T tokens on average; so a node pays for itself when its chance of being accepted
exceeds

    c = f'(N) * E / T

The heads' path probability p (``tree.subset``) estimates that chance up to a calibration
factor r = (nodes accepted) / (sum of p over the nodes verified), measured on the trees
verified so far, so a request drafts the nodes with r * p >= c: the threshold on p is c / r.
It rises with the load: at batch 1 a row is nearly free and the engine slow, so wide trees
pay; at batch 16 or 64 on a CPU every row costs what a decoded token costs, and only nodes
the heads are sure of are drafted, or none.

Worked example (illustrative figures): batch 1, f'(N) = 1.5 ms per row, 28 tokens/s, r = 1.2:
c = 0.042, so nodes of path probability >= 0.035. Batch 16, 1.0 ms per row, 300 tokens/s:
c = 0.30, p >= 0.25.

f is ``step_cost.StepCostModel`` (piecewise linear in N, non-decreasing, fitted online) fed
with decoding steps only (a step with a prefill chunk says little about a row's price); E / T
and r are exponentially weighted. Until ``warmup_steps`` decoding steps are measured the
threshold is ``start``. Pure Python and NumPy; the runner feeds it (``patches/trees.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_clover.budget.goodput import GoodputConfig
from vllm_clover.budget.step_cost import StepCostModel


@dataclass(frozen=True)
class TreeBudgetConfig:
    """How the threshold is learned; the defaults suit any engine, none needs tuning."""

    max_tokens: int = 8192  # the largest step (max_num_batched_tokens): the last cost knot
    start: float = 0.05  # the threshold before warmup_steps decoding steps are measured
    warmup_steps: int = 8
    floor: float = 0.005  # never draft nodes less likely than this (keeps drafting bounded)
    rate_memory: float = 0.98  # per-step forgetting of E / T (about 50 steps)
    calibration_memory: float = 0.995  # per-step forgetting of r (about 200 steps)


class TreeBudget:
    """Learns f, E / T and r from the runner's steps; ``threshold`` is the step's p."""

    def __init__(self, config: TreeBudgetConfig) -> None:
        self.config = config
        self.cost = StepCostModel(GoodputConfig(max_k=1, max_tokens=config.max_tokens))
        self.seconds = self.tokens = 0.0  # forgotten sums of decoding steps' time and output
        self.predicted, self.accepted = 1.0, 1.0  # a prior of one node, calibrated (r = 1)
        self.rows = 1  # scheduled rows of the last decoding step
        self.steps = 0  # decoding steps observed

    def observe_step(self, seconds: float, rows: int, tokens: int) -> None:
        """A decoding step: its wall time, scheduled rows and emitted tokens."""
        self.cost.observe(seconds, rows, 0, 1)
        memory = self.config.rate_memory
        self.seconds = memory * self.seconds + seconds
        self.tokens = memory * self.tokens + tokens
        self.rows = rows
        self.steps += 1

    def observe_nodes(self, predicted: float, accepted: int) -> None:
        """A step's verified trees: the sum of their nodes' path probabilities, and how many
        nodes were accepted."""
        memory = self.config.calibration_memory
        self.predicted = memory * self.predicted + predicted
        self.accepted = memory * self.accepted + accepted

    @property
    def calibration(self) -> float:
        """r: accepted nodes per unit of predicted path probability."""
        return self.accepted / max(self.predicted, 1e-9)

    def threshold(self) -> float:
        """The least path probability of a drafted node at the next step."""
        if self.steps < self.config.warmup_steps:
            return self.config.start
        row_seconds = self.cost.predict(self.rows + 1, 0, 1) - self.cost.predict(self.rows, 0, 1)
        chance = row_seconds * self.tokens / max(self.seconds, 1e-9)  # c = f'(N) E / T
        return max(chance / max(self.calibration, 1e-3), self.config.floor)
