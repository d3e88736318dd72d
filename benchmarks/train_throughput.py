"""Training throughput (tokens/s) and peak memory of `vllm-clover train` on the reference target.

    .venv/bin/python benchmarks/train_throughput.py                 # full vocab vs draft vocab
    .venv/bin/python benchmarks/train_throughput.py --samples 64 --max-tokens 20000 --json r.json

The hidden-state cache is filled first (its time is reported apart: it is the target's own
forward, paid once per data set and reused by every later run). Then each variant trains in a
fresh process, so its peak memory is its own: tokens/s counts the tokens of the optimizer
steps only (no caching, no evaluation); memory is the peak over the training loop (process
RSS on CPU, including the frozen LM-head copy; CUDA allocated bytes on a GPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(config_json: str) -> None:
    """Run one training job and print its result as one JSON line."""
    import torch

    from vllm_clover.training import TrainConfig, train

    fields = json.loads(config_json)
    torch.set_num_threads(fields.pop("threads"))
    result = train(TrainConfig(**fields))
    print(
        "RESULT "
        + json.dumps(
            {
                "steps": result.steps,
                "tokens": result.tokens_seen,
                "seconds": result.train_seconds,
                "tokens_per_s": result.tokens_per_second,
                "peak_bytes": result.peak_memory_bytes,
                "start_bytes": result.start_memory_bytes,
            }
        )
    )


def run_child(fields: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(fields)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"benchmark child failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def base_fields(args: argparse.Namespace, work: Path) -> dict:
    from vllm_clover.assets.target import fetch_reference_target

    return dict(
        target=str(fetch_reference_target()),
        data=args.data,
        out=str(work / "out"),
        max_samples=args.samples,
        max_seq_len=args.max_seq_len,
        eval_fraction=0.0,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        epochs=100,
        cache_dir=args.cache_dir or str(work / "cache"),
        eval_every=0,
        save_every=0,
        progress=False,
        threads=args.threads,
        device=args.device,
        overwrite=True,
    )


def fill_cache(fields: dict) -> float:
    """Time of filling the hidden-state cache (a 1-step run that also warms the file cache)."""
    started = time.perf_counter()
    run_child({**fields, "max_tokens": 1})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help="data file (default: bundled ShareGPT)")
    parser.add_argument("--samples", type=int, default=12, help="conversations to use")
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=2000, help="tokens per variant")
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: robust on a shared CPU)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", help="reuse a hidden-state cache root")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory(prefix="clover-bench-") as tmp:
        fields = base_fields(args, Path(tmp))
        cache_seconds = fill_cache(fields)
        variants = {
            "clover, full vocab": {},
            f"clover, draft vocab {args.draft_vocab_size}": {
                "draft_vocab_size": args.draft_vocab_size
            },
            "medusa, full vocab": {"medusa": True},
        }
        results = {name: run_child({**fields, **overrides}) for name, overrides in variants.items()}
    print(
        f"reference target, {args.samples} conversations x <= {args.max_seq_len} tokens, "
        f"batch {args.batch_size}, {args.threads} thread(s), device {args.device}; "
        f"cache fill + 1 step: {cache_seconds:.1f} s"
    )
    print("| variant | steps | tokens | tokens/s | peak RSS (GiB) | RSS at start (GiB) |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        peak, start = ((r[k] or 0) / 2**30 for k in ("peak_bytes", "start_bytes"))
        print(
            f"| {name} | {r['steps']} | {r['tokens']} | {r['tokens_per_s']:.0f} | "
            f"{peak:.2f} | {start:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"args": vars(args), "cache_seconds": cache_seconds, "results": results}, indent=2
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
