"""Answer tokens/s of `generate-data --engine hf`: padded, continuous and static batching.

Self-distilled answers are what the heads need, and generating them, not training, is what
limits them (docs/heads.md). This times the transformers engine's two batching modes on the
same first user turns of the bundled ShareGPT records, in alternating rounds (medians of
`--repeats` rounds, ranges in brackets), and counts the greedy replies equal to padded's:

    padded      model.generate on left-padded batches of similar prompt length
                (`--batch-size` prompts each; a batch runs until its longest reply ends)
    continuous  transformers' generate_batch (paged KV cache; a finished reply's slot goes
                to the next prompt at once)
    static      vllm_clover.training.static_decode (a KV cache allocated once per batch of
                `--batch-size` prompts, finished replies leaving it; Llama-type targets)

On this CPU (a minute or two):
    python benchmarks/generate_throughput.py --prompts 16 --max-new-tokens 32 --batch-size 8 \
        --json docs/bench/generate/cpu.json
On a GPU, the H200 run of docs/heads.md ("Self-distilled answers on a GPU"):
    python benchmarks/generate_throughput.py --device cuda --dtype bfloat16 --prompts 2048 \
        --batch-size 1024 --max-new-tokens 512 --max-model-len 1024 --repeats 1 --json OUT
"""

from __future__ import annotations

import argparse
import json
import time

from vllm_clover.training.config import GenerateConfig
from vllm_clover.training.data import load_conversations
from vllm_clover.training.generate_data import hf_generator

MODES = ("padded", "continuous", "static")


def first_turns(data: str | None, skip: int, count: int) -> list[list[dict[str, str]]]:
    """The first user turn of records skip .. skip + count - 1, each as a one-message chat."""
    conversations = load_conversations(data, skip + count)[skip:]
    turns = [next(m for m in c.messages if m.role == "user") for c in conversations]
    return [[{"role": "user", "content": m.content}] for m in turns]


def measure(args: argparse.Namespace, chats: list[list[dict[str, str]]]) -> dict:
    """Both modes loaded once, then `repeats` alternating rounds: seconds and replies."""
    generators = {}
    for mode in args.modes:
        cfg = GenerateConfig(
            target=args.target,
            out="unused",
            engine="hf",
            device=args.device,
            dtype=args.dtype,
            batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens,
            max_model_len=args.max_model_len,
            hf_batching=mode,
        )
        generators[mode] = hf_generator(args.target, cfg)
    seconds, replies = {mode: [] for mode in args.modes}, {}
    for _ in range(args.repeats):
        for mode, generate in generators.items():
            start = time.perf_counter()
            replies[mode] = generate(chats)
            seconds[mode].append(time.perf_counter() - start)
    return {"seconds": seconds, "replies": replies}


def summarise(seconds: dict, replies: dict, target: str) -> dict:
    """Per mode: answer tokens, median tokens/s and its range; the replies' agreement."""
    from transformers import AutoTokenizer

    from vllm_clover.training.teacher import resolve_target

    path, kwargs = resolve_target(target)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    rows = {}
    for mode in seconds:
        kept = [r for r in replies[mode] if r is not None]
        tokens = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in kept)
        times = sorted(seconds[mode])
        rows[mode] = {
            "replies": len(kept),
            "answer_tokens": tokens,
            "seconds": seconds[mode],
            "tokens_per_s": tokens / times[len(times) // 2],
            "range": [tokens / times[-1], tokens / times[0]],
        }
    first = next(iter(rows))  # the baseline: padded unless --modes leaves it out
    return {
        "modes": rows,
        "baseline": first,
        "vs_baseline": {
            m: r["tokens_per_s"] / rows[first]["tokens_per_s"] for m, r in rows.items()
        },
        "equal_to_baseline": {
            m: sum(a == b for a, b in zip(replies[first], replies[m], strict=True)) for m in rows
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--data", help="conversations JSONL (default: the bundled ShareGPT)")
    parser.add_argument("--skip", type=int, default=0, help="records to skip first")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8, help="padded and static batch")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    chats = first_turns(args.data, args.skip, args.prompts)
    measured = measure(args, chats)
    result = {"args": vars(args), **summarise(**measured, target=args.target)}
    for mode, row in result["modes"].items():
        low, high = row["range"]
        print(
            f"{mode:10s}: {row['tokens_per_s']:8.1f} answer tokens/s ({low:.1f}-{high:.1f}), "
            f"{row['answer_tokens']} tokens in {row['replies']} replies, "
            f"{result['vs_baseline'][mode]:.2f}x {result['baseline']}, "
            f"equal replies {result['equal_to_baseline'][mode]}/{len(chats)}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
