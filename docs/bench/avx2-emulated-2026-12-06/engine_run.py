"""One timed in-process run, bfloat16, MT-Bench first turns x 64 tokens: one JSON line.

usage: python engine_run.py {vanilla,goodput} BATCH   (CODE=old|new labels the line)

Prints tokens/s, wall seconds, engine steps and the median step time by scheduled tokens.
"""

import collections
import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from vllm_clover.assets.target import fetch_reference_target  # noqa: E402
from vllm_clover.bench.measure import engine  # noqa: E402
from vllm_clover.bench.prompts import load_prompts, take_prompts  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402

STEPS: list[tuple[int, float]] = []  # (scheduled tokens, seconds) per engine step


def time_steps() -> None:
    """Time each step from `schedule` to `update_from_output` (wrapping the plugin's own)."""
    schedule, update = Scheduler.schedule, Scheduler.update_from_output
    started = [0.0]

    def timed_schedule(self, *args, **kwargs):
        started[0] = time.perf_counter()
        return schedule(self, *args, **kwargs)

    def timed_update(self, scheduler_output, runner_output):
        if scheduler_output.total_num_scheduled_tokens:
            seconds = time.perf_counter() - started[0]
            STEPS.append((scheduler_output.total_num_scheduled_tokens, seconds))
        return update(self, scheduler_output, runner_output)

    Scheduler.schedule, Scheduler.update_from_output = timed_schedule, timed_update


def main() -> None:
    mode, batch = sys.argv[1], int(sys.argv[2])
    spec = None
    if mode != "vanilla":
        spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    chats = take_prompts(load_prompts(), max(16, 2 * batch))
    target = str(fetch_reference_target())
    with engine(target, spec, batch, dtype="bfloat16", enforce_eager=True) as llm:
        time_steps()
        llm.chat(chats[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        STEPS.clear()
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
        wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    by_tokens = collections.defaultdict(list)
    for n, seconds in STEPS:
        by_tokens[min(n, 9)].append(seconds)
    medians = {n: [len(v), round(1e3 * sorted(v)[len(v) // 2], 2)] for n, v in by_tokens.items()}
    line = {"mode": mode, "B": batch, "code": os.environ.get("CODE"), "wall": round(wall, 2)}
    line |= {"tok_s": round(tokens / wall, 2), "steps": len(STEPS), "by_tokens": medians}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
