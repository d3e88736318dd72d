"""Draft-row scoring formats (float, int8) and the fast bf16 CPU path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D
from vllm_clover.modeling.scoring import DraftRows, quantize_int8, row_scores

pytestmark = pytest.mark.unit


def test_quantize_int8_worked_example():
    q, scale = quantize_int8(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    assert q.dtype == torch.int8 and q.tolist() == [[64, -127, 32], [0, 0, 0]]
    torch.testing.assert_close(scale, torch.tensor([1 / 127, 1e-12 / 127]))


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


def test_int8_rows_score_like_the_float_rows():
    """int8 rows: scores = z . W[j] up to one positive factor per row of z."""
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(16, D, generator=gen)
    rows = DraftRows.of(exact, torch.int8)
    assert rows.dtype == torch.int8 and rows.scale.shape == (16,)
    torch.testing.assert_close(
        rows.weight.float() * rows.scale[:, None],
        exact,
        rtol=0,
        atol=float(rows.scale.max()) / 2 + 1e-6,
    )
    z = torch.randn(64, D, generator=gen)
    z_scale = z.abs().amax(-1, keepdim=True) / 127  # the factor scores() leaves out
    got, expected = rows.scores(z) * z_scale, F.linear(z, exact)
    assert got.shape == (64, 16) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.15)
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.9, agree  # near-ties may differ: drafts only propose
    torch.testing.assert_close(rows.logits(z), got, rtol=1e-5, atol=1e-5)  # scale put back


def test_logits_keep_each_rows_scores_contiguous():
    """Row-wise max and logsumexp follow scoring; on a transposed (N, M) view they run
    several times slower, so every format hands back (M, N) row-major logits."""
    exact, z = torch.randn(16, D), torch.randn(4, D)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int8):
        logits = DraftRows.of(exact, dtype).logits(z)
        assert logits.shape == (4, 16) and logits.dtype == torch.float32, dtype
        assert logits.is_contiguous(), dtype


def test_float_rows_are_a_cast():
    exact = torch.randn(8, D)
    rows = DraftRows.of(exact, torch.bfloat16)
    assert rows.scale is None and torch.equal(rows.weight, exact.bfloat16())
