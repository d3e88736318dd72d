"""Teacher throughput on the reference target: tokens/s of the cached teacher signal (the
post-norm hidden states and the argmax of the logits, `training/teacher.py: teacher_forward`)
for each way of running the target that `train` could use on this machine.

Options, each a fresh copy of the target in one process, timed in alternating rounds so that
a busy neighbour slows them alike (medians of `--repeats` rounds, ranges in brackets):

    dtype      float32 (what `train` caches on CPU today) or bfloat16 (AMX on this CPU)
    batch      padded tokens per forward (`--teacher-batch-tokens`), as sequences of
               `--seq-len` tokens: packed, every position a real token
    compile    the target under torch.compile (Inductor, C++ on CPU); its compile time is
               reported apart, paid once per process and shape

It also prints what the cache costs on disk per million tokens (H in the cache's bfloat16 and
the int32 argmax), the number that decides between caching and streaming a large corpus.

    python benchmarks/teacher_throughput.py --json docs/bench/teacher_throughput.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch


def build(target: str, dtype: str, compiled: bool):
    """The target as `train` loads it, in ``dtype``, under torch.compile if ``compiled``."""
    from vllm_clover.training.teacher import load_teacher

    teacher = load_teacher(target, torch.device("cpu"), getattr(torch, dtype))
    if compiled:
        teacher.model = torch.compile(teacher.model, dynamic=False)
    return teacher


def timed(teacher, ids: torch.Tensor, mask: torch.Tensor) -> float:
    from vllm_clover.training.teacher import teacher_forward

    start = time.perf_counter()
    with torch.no_grad():
        teacher_forward(teacher, ids, mask)
    return time.perf_counter() - start


def prepare(target: str, options: list[tuple], seq_len: int) -> dict:
    """Per option (dtype, batch tokens, compiled): its teacher, its packed input and the
    seconds of its first call (the compile, when compiled)."""
    prepared = {}
    for dtype, batch, compiled in options:
        teacher = build(target, dtype, compiled)
        gen = torch.Generator().manual_seed(batch)
        shape = (batch // seq_len, seq_len)
        ids = torch.randint(3, teacher.config.vocab_size, shape, generator=gen)
        mask = torch.ones_like(ids, dtype=torch.bool)
        first = timed(teacher, ids, mask)
        prepared[(dtype, batch, compiled)] = (teacher, (ids, mask), first)
    return prepared


def measure(prepared: dict, repeats: int) -> list[dict]:
    """Alternating rounds over the options; one row per option with its median tokens/s."""
    times = {key: [] for key in prepared}
    for _ in range(repeats):
        for key, (teacher, inputs, _) in prepared.items():
            times[key].append(timed(teacher, *inputs))
    rows = []
    for key, values in times.items():
        (dtype, _, compiled), (_, (ids, _), first) = key, prepared[key]
        median = sorted(values)[len(values) // 2]
        rows.append({
            "dtype": dtype,
            "batch_tokens": ids.numel(),
            "compiled": compiled,
            "tokens_per_s": ids.numel() / median,
            "range": [ids.numel() / max(values), ids.numel() / min(values)],
            "first_call_seconds": first,
            "seconds": values,
        })  # fmt: skip
    return rows


def main() -> None:
    from vllm_clover.training.cache import CACHE_DTYPE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--compile", choices=("off", "on", "both"), default="both")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    compiled = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    options = list(itertools.product(args.dtypes, args.batch_tokens, compiled))
    prepared = prepare(args.target, options, args.seq_len)
    rows = measure(prepared, args.repeats)
    for row in rows:
        print(
            f"{row['dtype']:9s} batch {row['batch_tokens']:5d} compile "
            f"{'on ' if row['compiled'] else 'off'}: {row['tokens_per_s']:6.0f} tokens/s "
            f"({row['range'][0]:.0f}-{row['range'][1]:.0f}), first call "
            f"{row['first_call_seconds']:.1f} s"
        )
    config = next(iter(prepared.values()))[0].config
    # the cache keeps H in CACHE_DTYPE whatever the teacher's dtype, and an int32 argmax
    per_token = config.hidden_size * CACHE_DTYPE.itemsize + 4
    print(f"hidden-state cache: {per_token * 1e6 / 2**30:.2f} GiB per 1M tokens on disk")
    if args.json:
        result = {
            "target": args.target,
            "threads": torch.get_num_threads(),
            "seq_len": args.seq_len,
            "vocab_size": config.vocab_size,
            "options": rows,
            "cache_bytes_per_token": per_token,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
