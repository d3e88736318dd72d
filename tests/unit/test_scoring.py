"""Draft-row scoring formats (float32, bfloat16, float16) and the fast bf16 CPU path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D
from vllm_clover.modeling.scoring import DraftRows, row_scores

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_scores_equal_linear(rows: int, dtype: torch.dtype):
    """The bf16 CPU path (w @ x^T, one row duplicated) scores as F.linear does."""
    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, D, generator=gen), torch.randn(40, D, generator=gen)
    got = row_scores(x.to(dtype), w.to(dtype))
    assert got.shape == (rows, 40) and got.dtype == dtype
    torch.testing.assert_close(got.float(), F.linear(x, w), rtol=2e-2, atol=5e-2)
    assert torch.equal(row_scores(x[None], w), F.linear(x[None], w))  # (..., D): F.linear


def test_logits_keep_each_rows_scores_contiguous():
    """Row-wise max and logsumexp follow scoring; on a transposed (N, M) view they run
    several times slower, so every format hands back (M, N) row-major logits."""
    exact, z = torch.randn(16, D), torch.randn(4, D)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = DraftRows.of(exact, dtype).logits(z)
        assert logits.shape == (4, 16) and logits.dtype == torch.float32, dtype
        assert logits.is_contiguous(), dtype


def test_float_rows_are_a_cast():
    exact = torch.randn(8, D)
    rows = DraftRows.of(exact, torch.bfloat16)
    assert rows.kernel is None and torch.equal(rows.weight, exact.bfloat16())
