"""Draft-row scoring formats on this CPU: the time of one head step's scoring (z (M, D)
against the N x D draft-vocabulary rows, ``DraftRows.logits``) in float32, bfloat16 and
float16 with PyTorch's matmuls, and in float32 and bfloat16 packed as served
(``float32-packed``, ``bfloat16-packed``: vLLM-CPU's oneDNN GEMM, bfloat16 on the plugin's
AVX2 GEMM where oneDNN has none, cpu/gemm.py), for M = 1..16 rows (requests, or a tree's
source nodes), medians of alternating rounds, and the format "auto" picks here
(``tables.cpu_scoring_dtype``).

    python benchmarks/scoring_formats.py --json docs/bench/scoring/formats_zen3.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from vllm_clover.cpu.gemm import onednn_row_packer, packed_dtypes
from vllm_clover.cpu.isa import cpu_flags, cpu_model, isa_family
from vllm_clover.modeling.scoring import PACKED_DTYPES, DraftRows
from vllm_clover.modeling.tables import DRAFT_DTYPES, cpu_scoring_dtype

PACKED = "-packed"  # suffix of the formats in the packed GEMM, as served on CPU


def measure(rows: int, hidden: int, ms: list[int], rounds: int, calls: int) -> dict:
    """{format: {M: [ms per call, one per round]}}, formats alternating within each round."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(rows, hidden, generator=gen) * 0.05
    formats = {name: DraftRows.of(weight, dtype) for name, dtype in DRAFT_DTYPES.items()}
    packer, packed = onednn_row_packer(), packed_dtypes()
    if packer is not None:
        for dtype in (d for d in PACKED_DTYPES if d in packed):
            name = str(dtype).removeprefix("torch.") + PACKED
            formats[name] = DraftRows.of(weight, dtype, packer)
    times: dict = {name: {m: [] for m in ms} for name in formats}
    for _ in range(rounds):
        for m in ms:
            z = torch.randn(m, hidden, generator=gen) * 3
            for name, draft_rows in formats.items():
                draft_rows.logits(z)  # warm
                start = time.perf_counter()
                for _ in range(calls):
                    draft_rows.logits(z)
                times[name][m].append((time.perf_counter() - start) / calls * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8192, help="draft vocabulary size")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    times = measure(args.rows, args.hidden, args.m, args.rounds, args.calls)
    print("| M | " + " | ".join(f"{name} (ms)" for name in times) + " |")
    print("|---:|" + "---:|" * len(times))
    for m in args.m:
        cells = [f"{statistics.median(times[name][m]):.2f}" for name in times]
        print(f"| {m} | " + " | ".join(cells) + " |")
    family = isa_family(cpu_flags())
    auto = str(cpu_scoring_dtype(packed_dtypes())).removeprefix("torch.")
    auto = auto + PACKED if auto + PACKED in times else auto
    print(f"auto picks {auto} here ({cpu_model()}, {family}, {platform.machine()})")
    if args.json:
        report = {
            "args": vars(args),
            "cpu": cpu_model(),
            "family": family,
            "auto": auto,
            "ms_per_call": times,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
