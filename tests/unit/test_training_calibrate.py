"""Draft-confidence calibration (`training/calibrate.py`): the worked example and its search."""

from __future__ import annotations

import pytest
import torch

from vllm_clover.training.calibrate import calibrate_confidence, chain_value

pytestmark = pytest.mark.unit

# The two starts of the worked example in docs/design/training-internals.md, "Draft-confidence
# calibration": p = [0.9, 0.2] h = [yes, no]; p = [0.3, 0.6] h = [no, yes]
CONFIDENCE = torch.tensor([[0.9, 0.2], [0.3, 0.6]])
HITS = torch.tensor([[True, False], [False, True]])


def test_chain_value_worked_example() -> None:
    always = chain_value(CONFIDENCE, HITS, torch.tensor([0.0, 0.0]), cost=0.25)
    assert (always.drafted, always.accepted, always.value) == (2.0, 0.5, 0.0)
    half = chain_value(CONFIDENCE, HITS, torch.tensor([0.5, 0.5]), cost=0.25)
    assert (half.drafted, half.accepted, half.value) == (0.5, 0.5, 0.375)


def test_a_stopped_chain_never_resumes() -> None:
    """Head 1 is right and confident at the second start, but head 0 stopped that chain."""
    got = chain_value(CONFIDENCE, HITS, torch.tensor([0.5, 0.0]), cost=0.0)
    assert got.drafted == (2 + 0) / 2 and got.accepted == (1 + 0) / 2


def test_calibration_beats_drafting_everything_and_stops_useless_heads() -> None:
    """Head 0 is right exactly when confident (p > 0.5); head 1 is never right."""
    gen = torch.Generator().manual_seed(0)
    p0 = torch.rand(2000, generator=gen)
    confidence = torch.stack([p0, torch.rand(2000, generator=gen)], dim=-1)  # (S, 2)
    hits = torch.stack([p0 > 0.5, torch.zeros(2000, dtype=torch.bool)], dim=-1)
    thresholds, tuned = calibrate_confidence(confidence, hits, cost=0.2)
    always = chain_value(confidence, hits, torch.zeros(2), cost=0.2)
    assert tuned.value > always.value
    assert 0.45 <= thresholds[0] <= 0.55  # drafts head 0 where it is right
    assert thresholds[1] == 1.0  # head 1 only costs: (almost) never drafted
    assert tuned.accepted == pytest.approx(always.accepted, abs=0.01)  # nothing worth lost


def test_free_drafts_keep_every_head() -> None:
    thresholds, tuned = calibrate_confidence(CONFIDENCE, HITS, cost=0.0)
    assert thresholds == [0.0, 0.0] and tuned.accepted == 0.5
    with pytest.raises(ValueError, match="cost must be >= 0"):
        calibrate_confidence(CONFIDENCE, HITS, cost=-1.0)
