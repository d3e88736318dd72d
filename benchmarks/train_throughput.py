"""Training throughput (tokens/s) and peak memory of `vllm-clover train` on the reference target.

    .venv/bin/python benchmarks/train_throughput.py                 # full vocab vs draft vocab
    .venv/bin/python benchmarks/train_throughput.py --samples 64 --max-tokens 20000 --json r.json
    .venv/bin/python benchmarks/train_throughput.py --variants clover2 clover2-compiled \
        --dtype bfloat16 --repeats 3                                  # --compile-heads

The hidden-state cache is filled first (its time is reported apart: it is the target's own
forward, paid once per data set and reused by every later run). Then each variant trains in a
fresh process, so its peak memory is its own: tokens/s counts the tokens of the optimizer
steps only (no caching, no evaluation); memory is the peak over the training loop (process
RSS on CPU, including the frozen LM-head copy; CUDA allocated bytes on a GPU). With
``--repeats`` R every variant runs R times, round by round in alternation, and the table gives
the median with its range. "steady tokens/s" leaves out each run's first optimizer step,
which holds a compiled variant's compile (its seconds are reported apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
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
                "step_seconds": [h["seconds"] for h in result.history],
                "step_tokens": step_tokens([h["tokens_seen"] for h in result.history]),
            }
        )
    )


def step_tokens(cumulative: list[int]) -> list[int]:
    """Tokens of each step from the running totals. Example: [10, 25, 31] -> [10, 15, 6]."""
    return [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]


def steady_rate(run: dict) -> float:
    """tokens/s over every step but the first (the first holds any compile)."""
    return sum(run["step_tokens"][1:]) / max(sum(run["step_seconds"][1:]), 1e-9)


# Named variants: TrainConfig fields over the base run; "{N}" is --draft-vocab-size.
VARIANTS = {
    "clover-full-vocab": {},
    "clover-draft-vocab": {"draft_vocab_size": "{N}"},
    "medusa-full-vocab": {"medusa": True},
    "clover2": {"clover2": True, "augmenting_gate": True, "draft_vocab_size": "{N}"},
    "clover2-compiled": {
        "clover2": True,
        "augmenting_gate": True,
        "draft_vocab_size": "{N}",
        "compile_heads": True,
    },
    "medusa-draft-vocab": {"medusa": True, "draft_vocab_size": "{N}"},
}


def variant_fields(name: str, draft_vocab_size: int) -> dict:
    return {k: draft_vocab_size if v == "{N}" else v for k, v in VARIANTS[name].items()}


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
        dtype=args.dtype,
        num_heads=args.num_heads,
    )


def fill_cache(fields: dict) -> float:
    """Time of filling the hidden-state cache (a 1-step run that also warms the file cache)."""
    started = time.perf_counter()
    run_child({**fields, "max_tokens": 1})
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child)
        return
    runs: dict[str, list[dict]] = {name: [] for name in args.variants}
    with tempfile.TemporaryDirectory(prefix="clover-bench-") as tmp:
        fields = base_fields(args, Path(tmp))
        cache_seconds = fill_cache(fields)
        for _ in range(args.repeats):  # alternating rounds: a busy spell hits every variant
            for name in args.variants:
                overrides = variant_fields(name, args.draft_vocab_size)
                runs[name].append(run_child({**fields, **overrides}))
    print(
        f"reference target, {args.samples} conversations x <= {args.max_seq_len} tokens, "
        f"batch {args.batch_size}, {args.num_heads} heads, {args.dtype}, {args.threads} "
        f"thread(s), device {args.device}, {args.repeats} round(s); cache fill + 1 step: "
        f"{cache_seconds:.1f} s"
    )
    print("| variant | steps | tokens/s | steady tokens/s | first step (s) | peak RSS (GiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, results in runs.items():
        cells = [
            spread([r["tokens_per_s"] for r in results], "{:.0f}"),
            spread([steady_rate(r) for r in results], "{:.0f}"),
            spread([r["step_seconds"][0] for r in results], "{:.1f}"),
            spread([(r["peak_bytes"] or 0) / 2**30 for r in results], "{:.2f}"),
        ]
        print(f"| {name} | {results[0]['steps']} | " + " | ".join(cells) + " |")
    if args.json:
        raw = {"args": vars(args), "cache_seconds": cache_seconds, "runs": runs}
        Path(args.json).write_text(json.dumps(raw, indent=2) + "\n")


def spread(values: list[float], fmt: str) -> str:
    """Median [min-max] of values, or the one value. Example: [3, 1, 2] -> '2 [1-3]'."""
    if len(values) == 1:
        return fmt.format(values[0])
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} [{fmt.format(low)}-{fmt.format(high)}]"


def parse_args() -> argparse.Namespace:
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
    parser.add_argument("--num-heads", type=int, default=3, help="K (the reference heads: 4)")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=["clover-full-vocab", "clover-draft-vocab", "medusa-full-vocab"],
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: robust on a shared CPU)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", help="reuse a hidden-state cache root")
    parser.add_argument("--json", help="also write the results here")
    return parser.parse_args()


if __name__ == "__main__":
    main()
