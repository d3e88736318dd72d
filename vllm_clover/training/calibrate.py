"""Per-head draft-confidence thresholds (the checkpoint's ``draft_confidence``), calibrated
on held-out chains.

A request's draft chain stops at the first head whose best token has probability below that
head's threshold (``HeadLoop.propose``). Every drafted token takes a verification slot in the
target's forward whether or not it is accepted; every accepted one saves part of a step.
Calibration picks the thresholds that maximise, over the chain starts ``evaluate`` collects,

    value(theta) = E[accepted] - cost * E[drafted]

where a start has head probabilities p_i and hits h_i (draft i equals the target's argmax),
``drafted`` is its number of leading heads with p_i >= theta_i and ``accepted`` its number of
leading heads with p_i >= theta_i and h_i. ``cost`` is the price of one verified draft in
accepted tokens (``eval-heads --draft-token-cost``). Worked example, cost 0.25, two starts::

    p = [0.9, 0.2], h = [yes, no]     p = [0.3, 0.6], h = [no, yes]
    theta = [0, 0]     : drafted 2 + 2, accepted 1 + 0 -> value (1 - 0.25 * 4) / 2 = 0
    theta = [0.5, 0.5] : drafted 1 + 0, accepted 1 + 0 -> value (1 - 0.25 * 1) / 2 = 0.375

The search is coordinate ascent over each head's threshold, candidates being quantiles of
that head's probabilities, 0 (always draft) and 1 (only a certain token), a few sweeps. It
starts from theta = 0 (draft every head), so it never returns a worse value than that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SWEEPS = 3
QUANTILES = 100


@dataclass(frozen=True)
class ChainValue:
    """Per-start means of a threshold setting over held-out chains."""

    accepted: float  # E[accepted drafts]
    drafted: float  # E[drafted tokens]
    value: float  # accepted - cost * drafted


def chain_value(
    confidence: torch.Tensor, hits: torch.Tensor, thresholds: torch.Tensor, cost: float
) -> ChainValue:
    """ChainValue of ``thresholds`` (K,) on starts with confidence, hits (S, K)."""
    drafted = (confidence >= thresholds).long().cumprod(dim=-1)  # (S, K) chain still drafting
    accepted = (drafted * hits.long()).cumprod(dim=-1)  # (S, K) and every draft so far right
    n = max(confidence.shape[0], 1)
    a, d = accepted.sum().item() / n, drafted.sum().item() / n
    return ChainValue(a, d, a - cost * d)


def calibrate_confidence(
    confidence: torch.Tensor, hits: torch.Tensor, cost: float
) -> tuple[list[float], ChainValue]:
    """(thresholds (K,) maximising ``chain_value``, their ChainValue); see module docstring."""
    if cost < 0:
        raise ValueError(f"draft-token cost must be >= 0, got {cost}")
    k = confidence.shape[-1]
    thresholds = torch.zeros(k)
    best = chain_value(confidence, hits, thresholds, cost)
    levels = torch.linspace(0, 1, QUANTILES + 1)
    for _ in range(SWEEPS):
        for i in range(k):
            column = confidence[:, i].float()
            candidates = column.quantile(levels) if column.numel() else levels
            for c in torch.cat([torch.tensor([0.0, 1.0]), candidates]).unique().tolist():
                trial = thresholds.clone()
                trial[i] = c
                got = chain_value(confidence, hits, trial, cost)
                if got.value > best.value + 1e-12:
                    thresholds, best = trial, got
    rounded = [round(x, 4) for x in thresholds.tolist()]  # what config.json will hold
    return rounded, chain_value(confidence, hits, torch.tensor(rounded), cost)
