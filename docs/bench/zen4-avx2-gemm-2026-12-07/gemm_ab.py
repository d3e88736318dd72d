"""A/B of two builds of the AVX2 bf16 GEMM over the reference target's weights, from memory.

usage: python gemm_ab.py OLD.c NEW.c OUT.json [rounds]

One "forward" multiplies M rows through the 121 bf16 weights of SmolLM2-135M's shapes (30 x
qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536, then the LM head 49152x576; 270 MB,
so every weight comes from memory as in a decode step), for M = 1 .. 6 (a decode step and
verification of 1 to 5 drafts). Rounds alternate the builds; medians and ranges in ms.
"""

import ctypes
import json
import statistics
import subprocess
import sys
import time

import torch

from vllm_clover.cpu.bf16_gemm import FLAGS, Bf16Gemm

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def load(source: str, name: str) -> Bf16Gemm:
    lib = f"/tmp/gemm_ab_{name}.so"
    subprocess.run(["cc", *FLAGS, source, "-o", lib], check=True)
    return Bf16Gemm(ctypes.CDLL(lib))


def main() -> None:
    old, new, out = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 7
    gemms = {"old": load(old, "old"), "new": load(new, "new")}
    torch.manual_seed(0)
    weights = [torch.randn(n, k).bfloat16() for n, k in SHAPES]
    x = torch.randn(6, 1536).bfloat16()
    ms: dict[str, list[float]] = {}
    for _ in range(rounds):
        for m in range(1, 7):
            for name, gemm in gemms.items():
                t = time.perf_counter()
                for w in weights:
                    gemm(x[:m, : w.shape[1]].contiguous(), w)
                ms.setdefault(f"{name} M={m}", []).append((time.perf_counter() - t) * 1e3)
    for key, values in ms.items():
        low, high = min(values), max(values)
        print(f"{key:9s} median {statistics.median(values):6.2f} ms  range {low:6.2f}-{high:6.2f}")
    with open(out, "w") as f:
        json.dump({"torch_threads": torch.get_num_threads(), "ms": ms}, f, indent=1)


if __name__ == "__main__":
    main()
