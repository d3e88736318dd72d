"""Per-head draft-confidence thresholds (the checkpoint's ``draft_confidence``) maximising
E[accepted] - cost * E[drafted] on held-out chains, by coordinate ascent from theta = 0 (draft
every head). How it works: docs/design/training-internals.md, "Draft-confidence calibration".
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
    """(thresholds (K,) maximising ``chain_value``, their ChainValue)."""
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
