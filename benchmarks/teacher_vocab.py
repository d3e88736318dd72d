"""Teacher throughput with a large vocabulary: hidden states + full-vocabulary argmax vs the
bare hidden-state forward, for a random Gemma-3-270M-shaped target (262,144-token vocabulary).

The teacher signal `train` caches is the target's post-norm hidden state H and the argmax of
its logits at every position (`training/teacher.py: teacher_forward`). With a 262k vocabulary
the logits of a whole batch do not fit in memory at once (8,192 positions x 262,144 x 4 bytes
= 8.6 GB); `argmax_rows` computes them 2**26 at a time. This prints, per batch:

    bare forward   the model's hidden states only (logits for the last position)
    teacher        the same plus the argmax over the full vocabulary, chunked
    ratio          teacher / bare (the goal: within 2x)
    peak RSS       of the process (the unchunked argmax needed the 8.6 GB above)

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


def main() -> None:
    from vllm_clover.training.teacher import argmax_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="positions per batch")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--json")
    args = parser.parse_args()
    model = build(getattr(torch, args.dtype))
    batch = args.tokens // args.seq_len
    ids = torch.randint(3, GEMMA3_270M["vocab_size"], (batch, args.seq_len))
    weight = model.get_output_embeddings().weight

    @torch.no_grad()
    def bare():
        return model(ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]

    @torch.no_grad()
    def teacher():
        return argmax_rows(bare(), weight)

    bare()  # warm-up
    result = {
        "shape": GEMMA3_270M,
        "dtype": args.dtype,
        "tokens": batch * args.seq_len,
        "threads": torch.get_num_threads(),
    }
    # alternate the two, so that a busy neighbour slows both alike
    timings = {"bare": [], "teacher": []}
    for _ in range(args.repeats):
        timings["bare"] += seconds(bare, 1)
        timings["teacher"] += seconds(teacher, 1)
    for name, values in timings.items():
        median = sorted(values)[len(values) // 2]
        result[name] = {"seconds": values, "tokens_per_s": result["tokens"] / median}
    result["ratio"] = result["bare"]["tokens_per_s"] / result["teacher"]["tokens_per_s"]
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"bare forward {result['bare']['tokens_per_s']:.0f} tokens/s, teacher "
        f"{result['teacher']['tokens_per_s']:.0f} tokens/s: teacher costs "
        f"{result['ratio']:.2f}x the bare forward; peak RSS {result['peak_rss_gb']:.1f} GB"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
