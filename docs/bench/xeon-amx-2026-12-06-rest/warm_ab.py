"""One in-process engine, bfloat16: warm up, then time the same 2 x BATCH MT-Bench first turns
RUNS times (64 tokens each); prints one JSON line with tokens/s per run and, for Clover, the
steps the proposer's block rested (None before the rest existed) and its K counts.

usage: python warm_ab.py vanilla|clover BATCH TAG RUNS
"""

import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402

from vllm_clover.assets.target import fetch_reference_target  # noqa: E402
from vllm_clover.bench.measure import engine  # noqa: E402
from vllm_clover.bench.prompts import load_prompts, take_prompts  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402


def proposer_log(worker):
    drafter = worker.model_runner.drafter
    rest = getattr(drafter, "rest", None)
    return getattr(rest, "rested", None), dict(drafter.draft_log.steps_by_k)


def main(method: str, batch: int, tag: str, runs: int) -> None:
    spec = None
    if method == "clover":
        spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    chats = take_prompts(load_prompts(), max(16, 2 * batch))
    target = str(fetch_reference_target())
    times, logs = [], []
    with engine(target, spec, batch, dtype="bfloat16", enforce_eager=True) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        for _ in range(runs):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            out = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
            times.append(time.perf_counter() - start)
            logs.append(None if spec is None else llm.collective_rpc(proposer_log)[0])
        tokens = sum(len(o.outputs[0].token_ids) for o in out)
    rates = [tokens / t for t in times]
    print(json.dumps({"tag": tag, "method": method, "batch": batch, "tps": rates, "log": logs}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
