"""Clover with dynamic speculation vs vanilla, at the batch sizes where drafting does not pay.

vLLM's `num_speculative_tokens_per_batch_size` picks K from the number of running requests;
K = 0 above a threshold turns speculation off for those steps. For heads without an
Augmenting Block (the reference heads) K = 0 does no drafting work at all (the proposer
returns an empty draft), so Clover there costs what vanilla costs. Measured in one process,
same prompts (MT-Bench first turns, chat template), greedy, 128 new tokens:

    python benchmarks/dynamic_k.py --batch-sizes 4 64 --schedule 1:2:4 3:1024:0
"""

from __future__ import annotations

import argparse
import os

from vllm_clover.bundled import REFERENCE_HEADS


def parse_band(text: str) -> list[int]:
    """ "LOW:HIGH:K" -> [LOW, HIGH, K] (vLLM's per-batch-size band). Example: "3:1024:0"."""
    try:
        low, high, k = (int(part) for part in text.split(":"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW:HIGH:K (integers)") from err
    return [low, high, k]


def tokens_per_second(target: str, spec: dict | None, batch: int, max_tokens: int):
    """(tokens/s, token ids) of one timed greedy run over max(16, 2 x batch) prompts."""
    from vllm import SamplingParams

    from vllm_clover.bench.measure import engine, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts

    chats = take_prompts(load_prompts(), max(16, 2 * batch))
    with engine(target, spec, batch) as llm:
        llm.chat(chats[:batch], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        run = timed_chat(llm, chats, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return run.tokens_per_second, run.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default=str(REFERENCE_HEADS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 64])
    parser.add_argument(
        "--schedule",
        type=parse_band,
        nargs="+",
        default=[[1, 2, 4], [3, 1024, 0]],
        help="LOW:HIGH:K bands",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.modeling import load_clover_config

    target = str(fetch_reference_target())
    spec = {
        "method": "clover",
        "model": args.heads,
        "num_speculative_tokens": load_clover_config(args.heads).num_heads,
        "num_speculative_tokens_per_batch_size": args.schedule,
    }
    print(
        f"schedule {args.schedule}\n| batch | vanilla tokens/s | Clover (dynamic K) "
        "tokens/s | ratio | T=0 equal |\n|---|---|---|---|---|"
    )
    for batch in args.batch_sizes:
        vanilla, reference = tokens_per_second(target, None, batch, args.max_tokens)
        clover, tokens = tokens_per_second(target, spec, batch, args.max_tokens)
        equal = sum(a == b for a, b in zip(reference, tokens, strict=True))
        print(
            f"| {batch} | {vanilla:.1f} | {clover:.1f} | {clover / vanilla:.2f}x | "
            f"{equal}/{len(tokens)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
