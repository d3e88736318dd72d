"""bfloat16 linear layers on this CPU: PyTorch's matmul, the plugin's AVX2 GEMM, and oneDNN.

For the reference target's layer shapes (q/k/v, o, gate/up, down, the LM head) and the draft
rows (8,192 x 576), at M rows of x (1: a decode step at batch 1; 5: a verification step of
K = 4; 32-512: batches and prefill chunks), medians of alternating rounds of warm calls:

    torch bf16     F.linear on bfloat16 (what vLLM-CPU runs where oneDNN refuses bf16)
    avx2 gemm      the plugin's kernel (cpu/bf16_gemm.py), bit-equal to the line above
    onednn f32     vLLM's packed oneDNN GEMM on float32 weights (twice the bytes), x cast
    onednn bf16    vLLM's packed oneDNN GEMM on bfloat16 (only on CPUs with bf16 units)

    python benchmarks/bf16_gemm.py --json docs/bench/cpu/bf16_gemm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
    "draft_rows": (8192, 576),
}
ROWS = (1, 2, 5, 8, 16, 32, 128, 512)


def kernels() -> dict:
    """The candidates on this CPU: name -> (prepare(weight) -> run(x))."""
    from vllm import _custom_ops as ops

    from vllm_clover.cpu.bf16_gemm import load_kernel
    from vllm_clover.cpu.gemm import onednn_takes_bf16

    out = {"torch bf16": lambda w: lambda x: F.linear(x, w)}
    gemm = load_kernel().kernel
    if gemm is not None:
        out["avx2 gemm"] = lambda w: lambda x: gemm(x, w)
    handler = ops.create_onednn_mm
    out["onednn f32"] = lambda w: _onednn(handler(w.float().t(), 32), ops, torch.float32)
    if onednn_takes_bf16():
        out["onednn bf16"] = lambda w: _onednn(handler(w.t(), 32), ops, torch.bfloat16)
    return out


def _onednn(handle, ops, dtype):
    return lambda x: ops.onednn_mm(handle, x.to(dtype), None)


def median_us(run, x, rounds: int, calls: int) -> float:
    run(x)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            run(x)
        times.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    from vllm_clover.cpu.isa import cpu_flags, cpu_model, isa_family

    candidates = kernels()
    rows = []
    for name, (n, k) in SHAPES.items():
        weight = (torch.randn(n, k) * 0.05).bfloat16()
        runs = {label: prepare(weight) for label, prepare in candidates.items()}
        for m in ROWS:
            x = torch.randn(m, k).bfloat16()
            calls = max(2, int(2e5 / (n * k * m / 1e3 + 1)))
            row = {"shape": name, "n": n, "k": k, "m": m}
            row.update(
                {label: median_us(run, x, args.rounds, calls) for label, run in runs.items()}
            )
            rows.append(row)
            print(
                " ".join(
                    f"{v:>10.0f}" if isinstance(v, float) else f"{v!s:>10}" for v in row.values()
                )
            )
    cpu = {
        "model": cpu_model(),
        "family": isa_family(cpu_flags()),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(cpu))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cpu": cpu, "unit": "microseconds per call", "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
