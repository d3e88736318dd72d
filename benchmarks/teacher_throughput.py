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


def option_names(dtypes: list[str], batches: list[int], compiled: list[bool]) -> list[tuple]:
    return list(itertools.product(dtypes, batches, compiled))


def build(target: str, dtype: str, compiled: bool):
    """(teacher, seconds spent compiling: 0 unless compiled, measured on the first call)."""
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


def main() -> None:
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
    options = option_names(args.dtypes, args.batch_tokens, compiled)
    vocab = None
    teachers, inputs, compile_seconds = {}, {}, {}
    for dtype, batch, comp in options:
        teacher = build(args.target, dtype, comp)
        vocab = teacher.config.vocab_size
        gen = torch.Generator().manual_seed(batch)
        ids = torch.randint(3, vocab, (batch // args.seq_len, args.seq_len), generator=gen)
        mask = torch.ones_like(ids, dtype=torch.bool)
        compile_seconds[(dtype, batch, comp)] = timed(teacher, ids, mask)  # warm-up / compile
        teachers[(dtype, batch, comp)], inputs[(dtype, batch, comp)] = teacher, (ids, mask)
    times = {key: [] for key in options}
    for _ in range(args.repeats):
        for key in options:
            times[key].append(timed(teachers[key], *inputs[key]))
    rows = []
    for (dtype, batch, comp), values in times.items():
        tokens = inputs[(dtype, batch, comp)][0].numel()
        median = sorted(values)[len(values) // 2]
        row = {
            "dtype": dtype,
            "batch_tokens": tokens,
            "compiled": comp,
            "tokens_per_s": tokens / median,
            "range": [tokens / max(values), tokens / min(values)],
            "first_call_seconds": compile_seconds[(dtype, batch, comp)],
            "seconds": values,
        }
        rows.append(row)
        print(
            f"{dtype:9s} batch {tokens:5d} compile {'on ' if comp else 'off'}: "
            f"{row['tokens_per_s']:6.0f} tokens/s ({row['range'][0]:.0f}-{row['range'][1]:.0f})"
            f", first call {row['first_call_seconds']:.1f} s"
        )
    from vllm_clover.training.cache import CACHE_DTYPE

    # the cache keeps H in CACHE_DTYPE whatever the teacher's dtype, and an int32 argmax
    per_token = teachers[options[0]].config.hidden_size * CACHE_DTYPE.itemsize + 4
    print(f"hidden-state cache: {per_token * 1e6 / 2**30:.2f} GiB per 1M tokens on disk")
    if args.json:
        result = {
            "target": args.target,
            "threads": torch.get_num_threads(),
            "seq_len": args.seq_len,
            "vocab_size": vocab,
            "options": rows,
            "cache_bytes_per_token": per_token,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
