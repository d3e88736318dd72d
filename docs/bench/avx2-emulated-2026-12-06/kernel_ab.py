"""A/B of two versions of the AVX2 bf16 GEMM (cpu/bf16_gemm.c), alternating, same inputs.

usage: python kernel_ab.py OLD.c NEW.c
(OLD.c, for example: `git show 3daf82d:vllm_clover/cpu/bf16_gemm.c > old.c`)

Builds both with the flags of cpu/bf16_gemm.py, checks that they give the same bits on the
reference target's shapes and odd ones, then times one "model": 30 layers of the reference
target's products (qkv, o, gate_up, down) plus its LM head, for M rows of x; median of 3
alternating rounds in ms.
"""

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vllm_clover.cpu.bf16_gemm import FLAGS, Bf16Gemm

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
LM_HEAD = (49152, 576)
ODD = [(1727, 576), (5, 576), (37, 100)]


def build(source: str, out: Path) -> Bf16Gemm:
    subprocess.run(["cc", *FLAGS, source, "-o", str(out)], check=True)
    return Bf16Gemm(ctypes.CDLL(str(out)))


def ms(kernel: Bf16Gemm, x: torch.Tensor, w: torch.Tensor, n: int = 40) -> float:
    for _ in range(5):
        kernel(x, w)
    start = time.perf_counter()
    for _ in range(n):
        kernel(x, w)
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    kernels = {
        name: build(src, tmp / f"{name}.so")
        for name, src in zip(("old", "new"), sys.argv[1:3], strict=True)
    }
    torch.manual_seed(0)
    shapes = [*LAYER, LM_HEAD, *ODD]
    weights = [torch.randn(n, k, dtype=torch.bfloat16) * 0.05 for n, k in shapes]
    for m in (1, 2, 3, 4, 5, 8, 16):
        xs = [torch.randn(m, w.shape[1], dtype=torch.bfloat16) for w in weights]
        for w, x in zip(weights, xs, strict=True):
            assert torch.equal(kernels["old"](x, w), kernels["new"](x, w)), (m, tuple(w.shape))
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(3):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                k = kernels[name]
                layer = sum(ms(k, x, w) for w, x in zip(weights[:4], xs[:4], strict=True))
                times[name].append(30 * layer + ms(k, xs[4], weights[4]))
        old, new = (sorted(times[n])[1] for n in ("old", "new"))
        print(
            f"M={m:2d}  old {old:6.2f} ms  new {new:6.2f} ms  new/old {new / old:.2f}", flush=True
        )


if __name__ == "__main__":
    main()
