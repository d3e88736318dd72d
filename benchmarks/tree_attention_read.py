"""One layer's tree attention, in isolation: the block-wise read against the ordered read.

`TreePlan.attend` multiplies the tree rows by the cache blocks as vLLM-CPU stores them where
the layout is plain (`blockwise_rows`); the ordered read puts keys and values in order first
and runs SDPA (`TreePlan.gather` + `tree_attention_rows`, what tiled layouts still use). Both
run here on a float32 cache of the reference target's attention shape (9 query heads, 3 KV
heads, head size 64, blocks of 128 tokens, as vLLM-CPU allocates it) with a 4-node tree, for
a few (requests, context) shapes; microseconds per call, medians of `--repeats` alternating
rounds of `--calls` calls each (ranges in brackets).

    python benchmarks/tree_attention_read.py --json docs/bench/trees/attention_read.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SHAPES = ((1, 150), (1, 600), (4, 150), (16, 300))  # (requests, context tokens)
TREE = "[(0,), (1,), (2,), (0, 0)]"


def setup(requests: int, context: int, block_size: int = 128):
    """(plan, q, kv_cache) for `requests` tree requests of `context` tokens each."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from vllm_clover.integration.tree_attention import CacheLayout, TreePlan
    from vllm_clover.tree.spec import TokenTree

    gen = torch.Generator().manual_seed(requests * 1000 + context)
    tree, head_size = TokenTree.parse(TREE), 64
    isa = _get_attn_isa(torch.float32, block_size, head_size, "auto")
    layout = CacheLayout.probe(isa, torch.float32, block_size, head_size)
    per_request = -(-context // block_size)
    blocks = torch.randperm(4 * requests * per_request, generator=gen)
    kv_cache = torch.randn(blocks.numel(), 3, block_size, 2 * head_size, generator=gen)
    table = blocks[: requests * per_request].view(requests, per_request).int()
    nodes = torch.full((requests,), tree.num_nodes)
    plan = TreePlan.of(tree, layout, table, torch.full((requests,), context), nodes)
    q = torch.randn(requests, tree.num_nodes + 1, 9, head_size, generator=gen)
    return plan, q, kv_cache


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - start) / calls


def readers(plan, q: torch.Tensor, kv: torch.Tensor) -> dict:
    """The two reads of one layer, as calls without arguments."""
    from vllm_clover.integration.tree_attention import blockwise_rows, tree_attention_rows

    return {
        "ordered": lambda: tree_attention_rows(plan, q, *plan.gather(kv), 0.125),
        "blockwise": lambda: blockwise_rows(plan, q, kv, 0.125),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for requests, context in SHAPES:
        reads = readers(*setup(requests, context))
        gap = (reads["ordered"]() - reads["blockwise"]()).abs().max().item()
        times = {name: [] for name in reads}
        for fn in reads.values():
            per_call_us(fn, 20)  # warm-up
        for _ in range(args.repeats):
            for name, fn in reads.items():
                times[name].append(per_call_us(fn, args.calls))
        row = {"requests": requests, "context": context, "max_abs_difference": gap}
        for name, values in times.items():
            row[name] = {"median_us": statistics.median(values), "runs_us": values}
        rows.append(row)
        ordered, blockwise = (row[n]["median_us"] for n in ("ordered", "blockwise"))
        print(f"requests {requests:2d}, context {context:3d}: ordered {ordered:7.1f} us "
              f"({min(times['ordered']):.1f}-{max(times['ordered']):.1f}), blockwise "
              f"{blockwise:7.1f} us ({min(times['blockwise']):.1f}-{max(times['blockwise']):.1f})"
              f", {ordered / blockwise:.2f}x, outputs within {gap:.1e}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, f,
                      indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
