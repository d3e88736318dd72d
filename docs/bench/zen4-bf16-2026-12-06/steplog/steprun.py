"""python steprun.py METHOD BATCH PPS RUNS: one engine (multiprocess unless MP=0), the bench's
warm-up then RUNS timed chats of max(16, PPS*BATCH) MT-Bench prompts x 64 tokens, bf16, T=0.
METHOD: vanilla | clover (default budget) | floor (K = 0 every step) | fixed1 (K = 1 fixed).
Prints wall and tokens/s per run and marks each run's start/end in STEPLOG/marks.jsonl."""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("MP", "1"))
from vllm import SamplingParams

from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.measure import engine
from vllm_clover.bench.prompts import load_prompts, take_prompts
from vllm_clover.bundled import CLOVER2_HEADS


def speculative_config(method: str) -> dict | None:
    """vanilla | clover (default budget) | floor (K = 0 every step) | fixed1 (K = 1 fixed)."""
    base = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    return {
        "vanilla": None,
        "clover": base,
        "floor": dict(
            base, draft_budget="fixed", num_speculative_tokens_per_batch_size=[[1, 1048576, 0]]
        ),
        "fixed1": dict(base, draft_budget="fixed", num_speculative_tokens=1),
    }[method]


def main():
    method, batch, pps, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    spec = speculative_config(method)
    chats = take_prompts(load_prompts(), max(16, pps * batch))
    marks = open(os.path.join(os.environ["STEPLOG"], "marks.jsonl"), "a")
    with engine(
        str(fetch_reference_target()), spec, batch, dtype="bfloat16", enforce_eager=True
    ) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        for r in range(runs):
            llm.reset_prefix_cache()
            t0 = time.perf_counter()
            outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
            t1 = time.perf_counter()
            tok = sum(len(o.outputs[0].token_ids) for o in outs)
            print(
                method,
                "run",
                r,
                "wall",
                round(t1 - t0, 2),
                "tok/s",
                round(tok / (t1 - t0), 1),
                flush=True,
            )
            marks.write(
                json.dumps(dict(method=method, run=r, t0=t0, t1=t1, tok=tok, pid=os.getpid()))
                + "\n"
            )


if __name__ == "__main__":
    main()
