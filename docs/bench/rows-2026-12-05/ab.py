"""One engine (in-process, bfloat16, Clover-2 or vanilla): warm up, then 2 timed runs of
16 or 2x batch MT-Bench first turns x 64 tokens; prints a JSON line.

usage: python ab.py {clover,vanilla} BATCH TAG   (TAG: old / new / van, the code under test)
"""

import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402 - after the engine mode is set

import vllm_clover  # noqa: E402
from vllm_clover.assets.target import fetch_reference_target  # noqa: E402
from vllm_clover.bench.measure import engine  # noqa: E402
from vllm_clover.bench.prompts import load_prompts, take_prompts  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402

method, batch, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = None
if method != "vanilla":
    spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
dtype = os.environ.get("DTYPE", "bfloat16")
chats = take_prompts(load_prompts(), max(16, 2 * batch))
target = str(fetch_reference_target())
with engine(target, spec, batch, dtype=dtype, enforce_eager=True) as llm:
    llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    times = []
    for _ in range(2):
        llm.reset_prefix_cache()
        started = time.perf_counter()
        out = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
        times.append(time.perf_counter() - started)
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
record = {"tag": tag, "method": method, "batch": batch, "dtype": dtype}
record |= {"tps": [tokens / t for t in times], "src": vllm_clover.__file__}
print(json.dumps(record), flush=True)
