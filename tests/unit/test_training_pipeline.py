"""Which LM-head rows the training split's cached argmax covers (`pipeline.argmax_rows_for`)."""

from __future__ import annotations

import pytest
import torch

from vllm_clover.training.pipeline import DRAFT_ARGMAX_MIN_VOCAB, DataSpec, argmax_rows_for

pytestmark = pytest.mark.unit

DRAFT = torch.tensor([3, 5, 9])


@pytest.mark.parametrize(
    ("mode", "vocab", "draft", "rows"),
    [
        ("full", 262144, DRAFT, None),  # asked for the full vocabulary
        ("draft", 1000, DRAFT, DRAFT),  # asked for the draft rows, whatever the vocabulary
        ("auto", 262144, DRAFT, DRAFT),  # Gemma 3's vocabulary: the LM head dominates
        ("auto", DRAFT_ARGMAX_MIN_VOCAB, DRAFT, None),  # up to 128k: full
        ("auto", 262144, None, None),  # no draft vocabulary: nothing else to use
    ],
)
def test_argmax_rows_for(mode: str, vocab: int, draft, rows) -> None:
    got = argmax_rows_for(DataSpec(target="T", train_argmax=mode), vocab, draft)
    assert (got is None) == (rows is None) and (rows is None or torch.equal(got, rows))
