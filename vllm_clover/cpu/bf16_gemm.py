"""The AVX2 bfloat16 GEMM (``bf16_gemm.c``): compiled once into the cache, called with ctypes.
It reads a weight once for all rows of x, where PyTorch's fallback reads it once per row, with
results equal to PyTorch's bit for bit. How it works, with an example:
docs/design/engine-layer.md, "The AVX2 bfloat16 GEMM"."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from vllm_clover.assets.cache import cache_root

SOURCE = Path(__file__).with_name("bf16_gemm.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
NEEDED_FLAGS = frozenset({"avx2", "fma"})  # /proc/cpuinfo flags the kernel's code uses
SYMBOL = "clover_bf16_linear"
# From this many rows of x (prefill chunks) the weight is widened to float32 block by block for
# PyTorch's float32 GEMM; below it (decode, verification) the kernel keeps PyTorch's bf16 sums.
LARGE_ROWS = 128
WEIGHT_BLOCK = 4096  # weight rows widened at a time


class Bf16Gemm:
    """x (..., K) bf16 @ weight (N, K)^T bf16 (+ bias (N,)) -> (..., N) bf16 on the C kernel."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = getattr(library, SYMBOL)
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        self._fn.restype = ctypes.c_int

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        n, k = weight.shape
        rows = x.reshape(-1, k).contiguous()  # (M, K)
        if rows.shape[0] >= LARGE_ROWS:
            return _widened(rows, weight, bias).view(*x.shape[:-1], n)
        out = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)  # (M, N)
        bias32 = None if bias is None else bias.float().contiguous()
        status = self._fn(
            rows.data_ptr(),
            weight.contiguous().data_ptr(),
            None if bias32 is None else bias32.data_ptr(),
            out.data_ptr(),
            rows.shape[0],
            n,
            k,
        )
        if status != 0:
            raise MemoryError(f"bf16 GEMM: no memory for a float32 copy of x {tuple(rows.shape)}")
        return out.view(*x.shape[:-1], n)


def _widened(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(M, N) bf16 = rows (M, K) @ weight^T (+ bias) in float32, weight widened per block."""
    x = rows.float()
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.bfloat16)
    for start in range(0, weight.shape[0], WEIGHT_BLOCK):
        block = slice(start, start + WEIGHT_BLOCK)
        product = x @ weight[block].float().t()  # (M, block)
        if bias is not None:
            product += bias[block].float()
        out[:, block] = product  # rounded to bf16, to nearest even
    return out


class KernelStatus(NamedTuple):
    """The kernel, or None with the reason it is not there (for the start-up line)."""

    kernel: Bf16Gemm | None
    reason: str = ""


def build(cache_dir: Path | None = None, compiler: str | None = None) -> Path:
    """The compiled library's path, building it on first use (RuntimeError if it cannot)."""
    compiler = compiler or os.environ.get("CC", "cc")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = (cache_dir or cache_root()) / "kernels" / digest / "libclover_bf16_gemm.so"
    if target.is_file():
        return target
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH (set $CC)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-300:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=1)
def load_kernel() -> KernelStatus:
    """The kernel for this CPU and process (built on first use), or why there is none."""
    from vllm_clover.cpu.isa import cpu_flags

    missing = NEEDED_FLAGS - cpu_flags()
    if missing:
        return KernelStatus(None, f"the CPU lacks {', '.join(sorted(missing))}")
    try:
        # libgomp.so.1 resolves to torch's own OpenMP runtime: one thread pool, as vLLM set it
        return KernelStatus(Bf16Gemm(ctypes.CDLL(str(build()))))
    except (OSError, RuntimeError) as err:
        return KernelStatus(None, f"the kernel could not be built: {err}")


@torch.library.custom_op("vllm_clover::bf16_linear", mutates_args=())
def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel as an operator torch.compile can trace (it cannot trace a ctypes call)."""
    return load_kernel().kernel(x, weight, bias)


@bf16_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """vLLM's ``cpu_linear(x, weight, bias)`` on the kernel: the operator while compiling,
    else the ctypes call itself (cheaper than the operator's dispatch, eager)."""
    if torch.compiler.is_compiling():
        return bf16_linear(x, weight, bias)
    return load_kernel().kernel(x, weight, bias)
