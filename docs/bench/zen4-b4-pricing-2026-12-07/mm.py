"""python mm.py: vLLM's oneDNN product (bfloat16, one thread, the weight in cache) for the
reference target's layer shapes at 1-32 rows; median of 5 x 300 calls, microseconds."""

import time

import torch
from vllm import _custom_ops as ops

torch.set_num_threads(1)


def timed(fn, n):
    for _ in range(20):
        fn()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return sorted(runs)[2]


for k, n in [(576, 3072), (1536, 576), (576, 960), (576, 49152)]:
    w = torch.randn(n, k, dtype=torch.bfloat16)
    handler = ops.create_onednn_mm(w.t(), 32)
    row = []
    for m in (1, 2, 4, 8, 16, 32):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        us = timed(lambda x=x, h=handler: ops.onednn_mm(h, x, None), 100 if n > 10000 else 300)
        row.append(f"M={m}: {us:.0f}")
    print(f"K={k} N={n}", " | ".join(row), "us")
