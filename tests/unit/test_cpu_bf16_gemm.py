"""The AVX2 bfloat16 GEMM (cpu/bf16_gemm.py, bf16_gemm.c): PyTorch's sums, read once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_clover.cpu import bf16_gemm
from vllm_clover.cpu.bf16_gemm import build, cpu_linear, load_kernel

pytestmark = pytest.mark.unit

# Shapes of the reference target's layers (qkv, gate_up, down, LM head rows) and odd ones
# (K not a multiple of 64 or of 16, N odd) that take the kernel's tails.
SHAPES = ((960, 576), (3072, 576), (576, 1536), (8192, 576), (37, 100), (5, 13))
ROWS = (1, 2, 3, 4, 5, 8, 17)


@pytest.fixture(scope="module")
def gemm():
    status = load_kernel()
    assert status.kernel is not None, f"the AVX2 GEMM did not load: {status.reason}"
    return status.kernel


@pytest.mark.parametrize("n,k", SHAPES)
def test_each_row_is_the_same_whatever_rows_are_beside_it(gemm, n, k):
    """A verification step's rows get the very sums a decode step's single row gets."""
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    for m in ROWS:
        x = torch.randn(m, k, generator=gen).bfloat16()
        for bias in (None, b):
            y = gemm(x, w, bias)
            assert y.shape == (m, n) and y.dtype == torch.bfloat16
            assert torch.equal(torch.cat([gemm(x[i : i + 1], w, bias) for i in range(m)]), y)
            exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            torch.testing.assert_close(y.double(), exact, rtol=1 / 128, atol=1e-3)


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != "AVX2",
    reason="PyTorch's bf16 matmul sums in 8-lane registers only in its AVX2 kernels",
)
@pytest.mark.parametrize("n,k", SHAPES)
def test_sums_equal_pytorchs_own_bf16_matmul_bit_for_bit(gemm, n, k):
    """Where PyTorch runs its AVX2 kernels (as on a CPU without AVX-512, or under
    ATEN_CPU_CAPABILITY=avx2), the kernel reproduces its order of sums exactly, so the
    patch changes how fast vLLM's bf16 layers run, not what they compute."""
    gen = torch.Generator().manual_seed(7 * n + k)
    w = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    for m in ROWS:
        x = torch.randn(m, k, generator=gen).bfloat16()
        assert torch.equal(gemm(x, w), F.linear(x, w))
        assert torch.equal(gemm(x, w, b), F.linear(x, w, b))


def test_prefill_sized_inputs_are_multiplied_in_float32_blocks(gemm, monkeypatch):
    """From LARGE_ROWS rows on, the weight is widened a block at a time (three blocks here):
    float32 products, rounded once to bf16, bias included."""
    monkeypatch.setattr(bf16_gemm, "WEIGHT_BLOCK", 16)
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(40, 96, generator=gen) * 0.05).bfloat16()
    b = torch.randn(40, generator=gen).bfloat16()
    x = torch.randn(bf16_gemm.LARGE_ROWS + 5, 96, generator=gen).bfloat16()
    y = gemm(x, w, b)
    exact = F.linear(x.double(), w.double(), b.double())
    assert y.dtype == torch.bfloat16 and y.shape == (x.shape[0], 40)
    torch.testing.assert_close(y.double(), exact, rtol=1 / 128, atol=1e-3)


def test_leading_dimensions_and_strided_inputs_are_kept(gemm):
    w = torch.randn(16, 64).bfloat16()
    x = torch.randn(2, 3, 128).bfloat16()[..., ::2]  # (2, 3, 64), not contiguous
    y = gemm(x, w)
    assert y.shape == (2, 3, 16)
    assert torch.equal(y.reshape(6, 16), gemm(x.reshape(6, 64).contiguous(), w))


def test_cpu_linear_traces_under_torch_compile(gemm):
    """vLLM compiles its model by default: the kernel is an operator dynamo traces, with
    the eager result."""
    w = torch.randn(24, 64).bfloat16()
    x = torch.randn(5, 64).bfloat16()
    compiled = torch.compile(lambda x: cpu_linear(x, w, None), backend="aot_eager")
    assert torch.equal(compiled(x), gemm(x, w))


def test_the_library_is_built_once_per_source_and_reused(tmp_path):
    path = build(tmp_path)
    assert path.is_file() and path.parent.parent == tmp_path / "kernels"
    stamp = path.stat().st_mtime_ns
    assert build(tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".build-")]


def test_no_compiler_is_a_reason_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(RuntimeError, match="no C compiler 'no-such-cc'"):
        build(tmp_path)
    monkeypatch.setattr(bf16_gemm, "cache_root", lambda: tmp_path)
    load_kernel.cache_clear()
    try:
        status = load_kernel()
        assert status.kernel is None and "no C compiler" in status.reason
    finally:
        load_kernel.cache_clear()


def test_a_cpu_without_avx2_keeps_pytorchs_path(monkeypatch):
    from vllm_clover.cpu import isa

    monkeypatch.setenv(isa.FLAGS_ENV, "sse4_2 avx")
    isa.cpu_flags.cache_clear()
    load_kernel.cache_clear()
    try:
        status = load_kernel()
        assert status.kernel is None and status.reason == "the CPU lacks avx2, fma"
    finally:
        isa.cpu_flags.cache_clear()
        load_kernel.cache_clear()
