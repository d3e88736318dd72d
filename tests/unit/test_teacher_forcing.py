"""Teacher forcing: which token feeds which head, and which token it must predict."""

from __future__ import annotations

import pytest
import torch

from vllm_clover.modeling import shift_tokens_for_heads

pytestmark = pytest.mark.unit


def test_shift_tokens_for_heads_worked_example() -> None:
    """The worked example of docs/design/network.md, "Teacher forcing: teacher_forcing.py"."""
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    out = shift_tokens_for_heads(ids, 2, pad_id=-1)
    assert out.input_ids[0].T.tolist() == [[11, 12, 13, 14, 15, -1], [12, 13, 14, 15, -1, -1]]
    assert out.target_ids[0].T.tolist() == [[12, 13, 14, 15, -1, -1], [13, 14, 15, -1, -1, -1]]
    assert out.mask[0].T.int().tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    padded = shift_tokens_for_heads(ids, 2, attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0]]))
    assert padded.mask[0].T.int().tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
