"""What the goodput draft budget chose, step by step, in the bench's own engine jobs.

Each round runs vanilla, Medusa and Clover (default `draft_budget` "goodput") at batch 1
exactly as `vllm-clover bench` does (a child process per engine, the 8-token warm-up request,
then 8 MT-Bench first turns x 64 tokens, T=0), with Clover's `GoodputController` traced: the
K of every step and its acceptance estimate. A round "stalls" when most of its steps after
the warm-up cycle run at K = 0 although the heads' drafts pay at batch 1.

    python benchmarks/goodput_trace.py --rounds 4 --json docs/bench/heads-3m-ref/goodput_trace.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

WARMUP_STEPS = 10  # the controller's warm-up cycle and the first prefill, left out of counts


def traced_clover_job(job) -> dict:
    """(In the bench's child process.) Run `job` with the controller's steps recorded."""
    from vllm_clover.bench.runner import run_engine_job
    from vllm_clover.integration.goodput import GoodputController

    steps = []
    observe = GoodputController.observe_step

    def recording(self, seconds, tokens, k, batch, verified, **kwargs):
        first_rate = float(self.acceptance.rates()[0][0])
        steps.append({"ms": round(1000 * seconds, 2), "tokens": tokens, "k": k, "a0": first_rate})
        return observe(self, seconds, tokens, k, batch, verified, **kwargs)

    GoodputController.observe_step = recording
    runs, _ = run_engine_job(job)
    (run,) = runs.values()
    later = Counter(step["k"] for step in steps[WARMUP_STEPS:])
    return {
        "tokens_per_second": run.tokens_per_second,
        "steps": len(steps),
        "k_counts_after_warmup": dict(sorted(later.items())),
        "first_steps": steps[:40],
    }


def main() -> None:
    from vllm_clover.assets.target import reference_target_dir
    from vllm_clover.bench.config import resolve_methods
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.bench.runner import (
        EngineJob,
        prepare_engine_server,
        run_engine_job,
        run_isolated,
    )
    from vllm_clover.bundled import REFERENCE_HEADS, REFERENCE_MEDUSA

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    prepare_engine_server()
    chats = take_prompts(load_prompts(None), 8)
    heads, medusa = str(REFERENCE_HEADS), str(REFERENCE_MEDUSA)
    methods = resolve_methods(["vanilla", "medusa", "clover"], heads, medusa, 4, [], ("goodput",))
    target, rounds = str(reference_target_dir()), []
    for repeat in range(args.rounds):
        for method in methods:
            job = EngineJob(target, method, 1, chats, (0.0,), 64, repeat, "in-process", "float32")
            if method.name != "clover":
                run_isolated(run_engine_job, job)
                continue
            traced = run_isolated(traced_clover_job, job)
            rounds.append(traced)
            print(f"round {repeat}: {traced['tokens_per_second']:.1f} tokens/s, K after the "
                  f"warm-up {traced['k_counts_after_warmup']}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
