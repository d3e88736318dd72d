"""Resident memory of a vLLM engine as it meets new batch shapes (the soak's RSS growth).

`benchmarks/soak.py` sees the worker's RSS grow after its warm-up, in steps that get smaller
(docs/serving.md). Hypothesis: on CPU every linear layer of the target keeps a cache of
oneDNN matmul primitives, one per token count M it has run, at most 32 per layer
(`create_onednn_mm(weight, 32)` in vLLM 0.32's model_executor/layers/utils.py); speculation
makes more distinct M (each request adds 1 + its drafts). If so, memory grows with each new
M until every layer's cache is full, then stops: a bound, not a leak.

This runs one in-process engine (reference target, float32, eager, no speculation) and
prefills prompts of ROUNDS x PER_ROUND distinct token counts, one request at a time, with
1 output token (M = the prompt length), printing RSS after each round; then repeats the
first round's lengths (cached shapes: no growth expected).

    python benchmarks/rss_by_shape.py --rounds 6 --per-round 16
"""

from __future__ import annotations

import argparse
import os

import psutil


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=16)
    parser.add_argument(
        "--first-length",
        type=int,
        default=40,
        help="shortest prompt (tokens, chat template included roughly)",
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import SamplingParams, TokensPrompt

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.engine import start_llm

    llm = start_llm(str(fetch_reference_target()), max_model_len=2048, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    process = psutil.Process()

    def prefill(lengths: list[int]) -> float:
        for length in lengths:  # one request per step: M = length exactly
            llm.generate(
                [TokensPrompt(prompt_token_ids=[100 + i % 500 for i in range(length)])],
                params,
                use_tqdm=False,
            )
        return process.memory_info().rss / 2**20

    first = list(range(args.first_length, args.first_length + args.per_round))
    start = prefill([args.first_length - 1])
    print(f"start: RSS {start:.1f} MiB")
    for r in range(args.rounds):
        lengths = [length + r * args.per_round for length in first]
        rss = prefill(lengths)
        print(
            f"round {r + 1}: {args.per_round} new token counts {lengths[0]}..{lengths[-1]} "
            f"({(r + 1) * args.per_round} distinct so far): RSS {rss:.1f} MiB "
            f"(+{rss - start:.1f})",
            flush=True,
        )
    rss = prefill(first)
    print(f"first round's token counts again: RSS {rss:.1f} MiB (+{rss - start:.1f})")


if __name__ == "__main__":
    main()
