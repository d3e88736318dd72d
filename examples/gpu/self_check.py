"""Check Clover speculative decoding on this machine: greedy equivalence and acceptance.

    python examples/gpu/self_check.py                        # defaults for this device
    python examples/gpu/self_check.py --num-prompts 4 --max-tokens 32 --batch-sizes 1 4
    python examples/gpu/self_check.py --target MODEL --heads HEADS_DIR

1. Equivalence. N MT-Bench prompts are generated greedily for up to M tokens, B requests at
   a time for each batch size B, once without speculation and once with Clover; the token
   ids must be the same for every prompt (speculation must never change greedy output).
   One excuse only: a floating-point near-tie. Verifying K+1 tokens per request sums in a
   different order than a one-token decode step, so where the vanilla run's top-2 logprob
   gap at the first differing token is below the dtype's resolution (NEAR_TIE), the other
   token is an equally valid argmax. Such prompts are listed, not failed.
2. Acceptance. tau = 1 + accepted drafts / drafts over all Clover runs must exceed
   --min-tau (1.0: some drafts are accepted).

Defaults: on CUDA the target's own dtype with CUDA graphs (vLLM's defaults), 32 prompts x
128 tokens at batch sizes 1, 8, 32; on CPU float32 and eager, 8 prompts x 64 tokens at 1, 4.
Prints PASS/FAIL with the numbers; the exit status is 0 only if both checks pass.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from vllm_clover.assets.data import mtbench_questions
from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.bench.measure import Counters, counters_from_metrics
from vllm_clover.bundled import REFERENCE_HEADS

# Largest top-2 logprob gap (nats) that counts as a tie, per dtype: float32 logits are exact
# to ~1e-6; bfloat16/float16 ones to 1/128 resp. 1/1024 of their size (logits of 16-32 are
# rounded to steps of 0.125 resp. 0.016 in bf16/fp16), so a gap of a few steps is a tie
# (bf16 on CPU: Clover/vanilla differences began at gaps 0, 0.0625, 0.125; docs/gpu.md).
NEAR_TIE = {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.05}
DEVICE_DEFAULTS = {
    "cuda": {
        "num_prompts": 32,
        "max_tokens": 128,
        "batch_sizes": [1, 8, 32],
        "engine": {"dtype": "auto", "enforce_eager": False},
    },
    "cpu": {
        "num_prompts": 8,
        "max_tokens": 64,
        "batch_sizes": [1, 4],
        "engine": {"dtype": "float32", "enforce_eager": True},
    },
}


def parse_args(device: str) -> argparse.Namespace:
    defaults = DEVICE_DEFAULTS[device]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        default=REFERENCE_TARGET,
        help="target model (default: the bundled reference target)",
    )
    parser.add_argument("--heads", default=str(REFERENCE_HEADS), help="Clover checkpoint")
    parser.add_argument(
        "--num-speculative-tokens", type=int, help="K (default: every trained head)"
    )
    parser.add_argument("--num-prompts", type=int, default=defaults["num_prompts"])
    parser.add_argument("--max-tokens", type=int, default=defaults["max_tokens"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=defaults["batch_sizes"])
    parser.add_argument(
        "--dtype",
        default=defaults["engine"]["dtype"],
        help="vLLM dtype (default: %(default)s on this device)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        default=defaults["engine"]["enforce_eager"],
        help="no torch.compile / CUDA graphs (always on for CPU)",
    )
    parser.add_argument("--min-tau", type=float, default=1.0)
    return parser.parse_args()


def run_engine(
    target: str, spec: dict | None, chats: list, args: argparse.Namespace, with_gaps: bool
) -> tuple[dict, str, Counters]:
    """Start an engine, generate `chats` at every batch size, shut the engine down.

    Returns {batch size: (token ids, top-2 gaps or None)}, the dtype the engine ran in and
    the counters the generation moved (drafts, accepted tokens).
    """
    from vllm_clover.engine import start_llm

    llm = start_llm(
        target,
        speculative_config=spec,
        max_num_seqs=max(args.batch_sizes),
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        disable_log_stats=False,
    )
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    before = counters_from_metrics(llm.get_metrics())
    results = {b: generate(llm, chats, b, args.max_tokens, with_gaps) for b in args.batch_sizes}
    counters = counters_from_metrics(llm.get_metrics()) - before
    llm.llm_engine.engine_core.shutdown()  # frees the device before the next engine starts
    del llm
    gc.collect()
    return results, dtype, counters


def generate(llm, chats: list, batch_size: int, max_tokens: int, with_gaps: bool):
    """Greedy token ids per prompt, `batch_size` requests at a time, and (with_gaps) the
    top-2 logprob gap at every generated position."""
    from vllm import SamplingParams

    llm.reset_prefix_cache()  # every batch size prefills from scratch
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, logprobs=2 if with_gaps else None
    )
    outputs = []
    for start in range(0, len(chats), batch_size):
        outputs += llm.chat(chats[start : start + batch_size], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    if not with_gaps:
        return tokens, None
    gaps = [[top2_gap(position) for position in o.outputs[0].logprobs] for o in outputs]
    return tokens, gaps


def top2_gap(position_logprobs: dict) -> float:
    """Logprob of the best token minus that of the second best at one position."""
    best = sorted((lp.logprob for lp in position_logprobs.values()), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def classify(vanilla: list[int], clover: list[int], gaps: list[float], tie: float) -> str:
    """'identical', 'near-tie at token i (...)' or 'DIVERGED at token i (...)'."""
    if vanilla == clover:
        return "identical"
    first = next(
        (i for i, (a, b) in enumerate(zip(vanilla, clover, strict=False)) if a != b),
        min(len(vanilla), len(clover)),
    )
    gap = gaps[first] if first < len(gaps) else float("inf")
    kind = "near-tie" if gap < tie else "DIVERGED"
    return f"{kind} at token {first} (vanilla top-2 logprob gap {gap:.3g})"


def check_equivalence(vanilla: dict, clover: dict, dtype: str) -> bool:
    """Print per-batch-size verdicts and the PASS/FAIL line; True if nothing diverged."""
    tie = NEAR_TIE.get(dtype, NEAR_TIE["bfloat16"])
    verdicts = []
    for batch_size, (tokens, gaps) in vanilla.items():
        batch = [
            classify(v, c, g, tie)
            for v, c, g in zip(tokens, clover[batch_size][0], gaps, strict=True)
        ]
        print(f"batch size {batch_size:3d}: {batch.count('identical')}/{len(batch)} identical")
        for prompt, verdict in enumerate(batch):
            if verdict != "identical":
                print(f"    prompt {prompt}: {verdict}")
        verdicts += batch
    identical = verdicts.count("identical")
    ties = sum(v.startswith("near-tie") for v in verdicts)
    diverged = len(verdicts) - identical - ties
    print(
        f"\n{'FAIL' if diverged else 'PASS'} equivalence ({dtype}): {identical}/{len(verdicts)} "
        f"identical, {ties} near-ties (top-2 gap < {tie:g}), {diverged} diverged"
    )
    return not diverged


def check_acceptance(counters: Counters, min_tau: float) -> bool:
    """Print the PASS/FAIL line for tau; True if tau > min_tau."""
    tau = counters.tau or 1.0
    rates = ", ".join(f"{rate:.2f}" for rate in counters.acceptance_rates)
    print(
        f"{'PASS' if tau > min_tau else 'FAIL'} acceptance: tau = {tau:.3f} "
        f"(needs > {min_tau:g}; {counters.accepted}/{counters.draft_tokens} draft tokens "
        f"accepted in {counters.drafts} drafts; per position {rates or '-'})"
    )
    return tau > min_tau


def main() -> int:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = parse_args(device)
    if device == "cpu":
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    target = str(fetch_reference_target()) if args.target == REFERENCE_TARGET else args.target
    chats = [[{"role": "user", "content": q.turns[0]}] for q in mtbench_questions()]
    chats = [chats[i % len(chats)] for i in range(args.num_prompts)]
    spec = {"method": "clover", "model": args.heads}
    if args.num_speculative_tokens:
        spec["num_speculative_tokens"] = args.num_speculative_tokens
    print(
        f"device {device}, dtype {args.dtype}, "
        f"{'eager' if args.enforce_eager else 'compiled, CUDA graphs where supported'}\n"
        f"target {target}\nheads {args.heads}\n{len(chats)} MT-Bench prompts x up to "
        f"{args.max_tokens} tokens, greedy, batch sizes {args.batch_sizes}",
        flush=True,
    )

    vanilla, dtype, _ = run_engine(target, None, chats, args, with_gaps=True)
    clover, _, counters = run_engine(target, spec, chats, args, with_gaps=False)
    equivalent = check_equivalence(vanilla, clover, dtype)
    accepting = check_acceptance(counters, args.min_tau)
    return 0 if equivalent and accepting else 1


if __name__ == "__main__":
    sys.exit(main())
