"""Greedy output equivalence of Clover with vanilla decoding, at scale, with near-tie analysis.

For each max_num_seqs, the same MT-Bench prompts are generated greedily without and with
Clover; the token ids must be equal. A divergence is excused only as a floating-point
near-tie: the vanilla top-2 logit gap at the first diverging token within the target dtype's
noise (logprob differences equal logit differences). In float32 that is 1e-4. In bfloat16
the logits are bf16 numbers (one rounding step is 0.125 at this target's top-logit magnitudes)
computed through 30 layers of bf16 arithmetic whose matmul shapes differ between decoding one
token and verifying several, or between batch sizes: vanilla decoding itself changes its
greedy output with the batch size there, diverging at gaps up to 0.25 (docs/equivalence.md),
so a divergence within 0.5 is bf16 noise. For each batch size the script also compares
vanilla with vanilla at the first batch size, to show that noise. Prints a table and writes JSON.

    python benchmarks/equivalence.py --out docs/equivalence.json
    python benchmarks/equivalence.py --dtype bfloat16 --batch-sizes 1 4 16 \
        --out docs/equivalence-bf16.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from vllm_clover.bench.ties import NEAR_TIE, first_difference, top2_gap
from vllm_clover.bundled import REFERENCE_HEADS


def generate(
    target: str, chats: list, max_tokens: int, batch: int, spec: dict | None, dtype: str = "float32"
):
    """Greedy token ids per prompt and, per position, the top-2 logprob gap (vanilla only).

    Not a speed measurement (the vanilla pass also computes logprobs): see the demo.
    """
    from vllm import SamplingParams

    from vllm_clover.engine import start_llm

    llm = start_llm(
        target, speculative_config=spec, max_num_seqs=batch, disable_log_stats=False, dtype=dtype
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=None if spec else 2)
    outputs = llm.chat(chats, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    gaps = None
    if not spec:
        gaps = [[top2_gap(position) for position in o.outputs[0].logprobs] for o in outputs]
    metrics = {
        m.name: getattr(m, "values", None) or m.value
        for m in llm.get_metrics()
        if "spec_decode" in m.name
    }
    del llm
    return tokens, gaps, metrics


def compare(
    vanilla: list[list[int]],
    gaps: list[list[float]],
    clover: list[list[int]],
    near_tie: float = NEAR_TIE["float32"],
) -> dict:
    """Equal prompts, near-tie divergences and real divergences (with their first index)."""
    result = {"equal": 0, "near_ties": [], "divergences": []}
    for prompt, (a, b) in enumerate(zip(vanilla, clover, strict=True)):
        if a == b:
            result["equal"] += 1
            continue
        first = first_difference(a, b)
        gap = gaps[prompt][first] if first < len(gaps[prompt]) else float("inf")
        entry = {"prompt": prompt, "first_diverging_token": first, "vanilla_top2_gap": gap}
        result["near_ties" if gap <= near_tie else "divergences"].append(entry)
    return result


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default=str(REFERENCE_HEADS))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--dtype", default="float32", choices=sorted(NEAR_TIE))
    parser.add_argument("--out", help="write the results as JSON here")
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vllm_clover.assets.data import mtbench_questions
    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.modeling.checkpoint import load_clover_config

    target = str(fetch_reference_target())
    chats = [
        [{"role": "user", "content": q.turns[0]}] for q in mtbench_questions()[: args.num_prompts]
    ]
    k = load_clover_config(args.heads).num_heads
    spec = {"method": "clover", "model": args.heads, "num_speculative_tokens": k}
    rows, first = [], None
    for batch in args.batch_sizes:
        vanilla, gaps, _ = generate(target, chats, args.max_tokens, batch, None, args.dtype)
        clover, _, metrics = generate(target, chats, args.max_tokens, batch, spec, args.dtype)
        first = first or (batch, vanilla, gaps)
        # The same engine without speculation at the first batch size: how much the dtype's
        # batch numerics alone move greedy outputs (none in float32).
        baseline = compare(first[1], first[2], vanilla, NEAR_TIE[args.dtype])
        row = {
            "max_num_seqs": batch,
            f"vanilla_equal_to_vanilla_at_{first[0]}": baseline["equal"],
            "vanilla_divergences_from_batch_" + str(first[0]): baseline,
            **compare(vanilla, gaps, clover, NEAR_TIE[args.dtype]),
            "tau": 1
            + metrics["vllm:spec_decode_num_accepted_tokens"]
            / max(metrics["vllm:spec_decode_num_drafts"], 1),
        }
        rows.append(row)
        print(
            f"max_num_seqs {batch:3d}: {row['equal']}/{len(chats)} equal, "
            f"{len(row['near_ties'])} near-ties, {len(row['divergences'])} divergences; "
            f"tau {row['tau']:.2f}; vanilla vs vanilla at max_num_seqs {first[0]}: "
            f"{baseline['equal']}/{len(chats)} equal",
            flush=True,
        )
    if args.out:
        summary = {
            "prompts": len(chats),
            "max_tokens": args.max_tokens,
            "heads": args.heads,
            "num_speculative_tokens": k,
            "dtype": args.dtype,
            "near_tie_threshold": NEAR_TIE[args.dtype],
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
