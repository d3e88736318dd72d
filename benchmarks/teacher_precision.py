"""What a cheaper teacher costs the training signal: the cached hidden states and argmax of a
bfloat16 target (eager, and compiled as `--compile-teacher` runs it) against a float32 one, on
the same real sequences.

Each option fills its own fresh cache through `training/pipeline.py: prepare`, exactly as
`train` would (tokenisation, split, length buckets of the compiled fill), and the caches are
then compared sequence by sequence:

    argmax agreement   share of tokens whose cached argmax (the target's greedy next token,
                       what head 0's training top-1 is scored against) is the same
    H relative error   ||H_a - H_b|| / ||H_b|| over all tokens, H the post-norm hidden state
                       the heads read and the soft labels are computed from

The held-out evaluation (`eval-heads`, float32 by default) is unaffected by the training
cache's dtype; this measures only what the heads are trained on.

    python benchmarks/teacher_precision.py --json docs/bench/teacher_precision.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

# (name, teacher dtype, compiled): the float32 eager teacher is the reference.
OPTIONS = (
    ("float32", torch.float32, False),
    ("bfloat16", torch.bfloat16, False),
    ("bfloat16-compiled", torch.bfloat16, True),
)


def fill(args, dtype: torch.dtype, compiled: bool, cache_dir: Path) -> tuple[dict, float]:
    """{key: (H (T, D) float32, argmax (T,))} of every sequence (training and held-out split)
    and the seconds the fill took."""
    from vllm_clover.training.pipeline import DataSpec, prepare
    from vllm_clover.training.runtime import init_runtime

    spec = DataSpec(
        target=args.target,
        data=args.data,
        max_samples=args.max_samples,
        max_seq_len=args.max_seq_len,
        cache_dir=str(cache_dir),
        compile_teacher=compiled,
        teacher_signal="cache",
        progress=False,
    )
    start = time.perf_counter()
    prepared = prepare(spec, init_runtime("cpu"), dtype)
    seconds = time.perf_counter() - start
    out = {}
    for seq in prepared.train + prepared.eval:
        hidden, top1 = prepared.cache.get(seq.key)
        out[seq.key] = (hidden.float(), top1.long())
    prepared.release_teacher()
    return out, seconds


def compare(a: dict, b: dict) -> dict:
    """Argmax agreement and H relative error of cache ``a`` against cache ``b``."""
    same = total = 0
    err = ref = 0.0
    for key, (h_b, t_b) in b.items():
        h_a, t_a = a[key]
        same += int((t_a == t_b).sum())
        total += t_b.numel()
        err += float((h_a - h_b).pow(2).sum())
        ref += float(h_b.pow(2).sum())
    relative = (err / ref) ** 0.5
    return {"tokens": total, "argmax_agreement": same / total, "h_relative_error": relative}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--data", default=None, help="conversations (default: bundled ShareGPT)")
    parser.add_argument("--max-samples", type=int, default=100)
    parser.add_argument("--max-seq-len", type=int, default=768)
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = parser.parse_args()

    caches, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="teacher-precision-") as tmp:
        for name, dtype, compiled in OPTIONS:
            caches[name], seconds[name] = fill(args, dtype, compiled, Path(tmp) / name)
            print(f"{name}: filled {len(caches[name])} sequences in {seconds[name]:.0f} s")
    pairs = [("bfloat16", "float32"), ("bfloat16-compiled", "float32")]
    pairs.append(("bfloat16-compiled", "bfloat16"))
    results = {f"{a} vs {b}": compare(caches[a], caches[b]) for a, b in pairs}
    print("\n| cache | against | tokens | argmax agreement | H relative error |")
    print("|---|---|---:|---:|---:|")
    for (a, b), r in zip(pairs, results.values(), strict=True):
        print(
            f"| {a} | {b} | {r['tokens']:,} | {r['argmax_agreement']:.2%} "
            f"| {r['h_relative_error']:.2%} |"
        )
    if args.json:
        raw = {"config": vars(args) | {"json": str(args.json)}, "fill_seconds": seconds}
        args.json.write_text(json.dumps(raw | {"results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
