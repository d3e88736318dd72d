"""Drafting seconds per step of one Clover-2 engine (in-process, bfloat16): warm up, then 2
timed runs of 16 or 2x batch MT-Bench first turns x 64 tokens; prints a JSON line.

usage: python ab2.py BATCH TAG   (TAG: old / new, the code under test)
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402 - after the engine mode is set

from vllm_clover.assets.target import fetch_reference_target  # noqa: E402
from vllm_clover.bench.measure import engine, install_drafting_timer, timed_chat  # noqa: E402
from vllm_clover.bench.prompts import load_prompts, take_prompts  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402

batch, tag = int(sys.argv[1]), sys.argv[2]
spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
chats = take_prompts(load_prompts(), max(16, 2 * batch))
target = str(fetch_reference_target())
with engine(target, spec, batch, dtype="bfloat16", enforce_eager=True) as llm:
    install_drafting_timer(llm)
    llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    runs = []
    for _ in range(2):
        llm.reset_prefix_cache()
        run = timed_chat(llm, chats, SamplingParams(temperature=0, max_tokens=64))
        counters = run.counters
        runs.append(
            {
                "s": run.seconds,
                "draft_s": counters.drafting_seconds,
                "calls": counters.drafting_calls,
                "steps": counters.steps,
            }
        )
print(json.dumps({"tag": tag, "batch": batch, "runs": runs}), flush=True)
