"""Teacher throughput with a large vocabulary: hidden states + full-vocabulary argmax vs the
bare hidden-state forward, for a random Gemma-3-270M-shaped target (262,144-token vocabulary).

The teacher signal `train` caches is the target's post-norm hidden state H and the argmax of
its logits at every position (`training/teacher.py: teacher_forward`). With a 262k vocabulary
the logits of a whole batch do not fit in memory at once (8,192 positions x 262,144 x 4 bytes
= 8.6 GB); `argmax_rows` computes them 2**26 at a time. This prints, per batch:

    bare                 the model's hidden states only (logits for the last position)
    teacher              `teacher_forward`: the same plus the full-vocabulary argmax, chunked
    teacher_draft_rows   `teacher_forward` over N draft rows (`train --train-argmax draft`,
                         the default above 131,072 tokens with a draft vocabulary)
    ratio                its time / the bare forward's (the goal: within 2x)
    peak RSS             of the process (the unchunked argmax needed the 8.6 GB above)

    python benchmarks/teacher_vocab.py --tokens 4096 --json docs/bench/teacher_vocab.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

# Gemma-3-270M's text shape (Hugging Face config), random weights: no download needed.
GEMMA3_270M = dict(
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    vocab_size=262144,
    max_position_embeddings=32768,
)


def build(dtype: torch.dtype):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(**GEMMA3_270M, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return Gemma3ForCausalLM(config).to(dtype).eval()


def seconds(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="positions per batch")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draft-vocab-size", type=int, default=32768)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--json")
    return parser.parse_args()


def main() -> None:
    from vllm_clover.training.teacher import Teacher, teacher_forward

    args = _parse_args()
    model = build(getattr(torch, args.dtype))
    batch = args.tokens // args.seq_len
    ids = torch.randint(3, GEMMA3_270M["vocab_size"], (batch, args.seq_len))
    mask = torch.ones_like(ids, dtype=torch.bool)
    teacher = Teacher("gemma3-270m-shape", "", model, None, model.config, None, None, "")
    # any N ids serve: the cost depends on N only (`train` takes the most frequent ones)
    rows = torch.randperm(GEMMA3_270M["vocab_size"])[: args.draft_vocab_size].sort().values
    runs = {
        "bare": lambda: model(
            ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1
        ).hidden_states[-1],
        "teacher": lambda: teacher_forward(teacher, ids, mask),
        "teacher_draft_rows": lambda: teacher_forward(teacher, ids, mask, rows),
    }
    with torch.no_grad():
        runs["bare"]()  # warm-up
    result = {
        "shape": GEMMA3_270M,
        "dtype": args.dtype,
        "tokens": batch * args.seq_len,
        "draft_vocab_size": args.draft_vocab_size,
        "threads": torch.get_num_threads(),
    }
    # alternate the three, so that a busy neighbour slows them alike
    timings = {name: [] for name in runs}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, fn in runs.items():
                timings[name] += seconds(fn, 1)
    for name, values in timings.items():
        median = sorted(values)[len(values) // 2]
        result[name] = {"seconds": values, "tokens_per_s": result["tokens"] / median}
        result[name]["ratio"] = result["bare"]["tokens_per_s"] / result[name]["tokens_per_s"]
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    for name in runs:
        r = result[name]
        spread = [result["tokens"] / s for s in (max(r["seconds"]), min(r["seconds"]))]
        print(
            f"{name:20s} {r['tokens_per_s']:6.0f} tokens/s ({spread[0]:.0f}-{spread[1]:.0f})"
            f"  {r['ratio']:.2f}x the bare forward's time"
        )
    print(f"peak RSS {result['peak_rss_gb']:.1f} GB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
