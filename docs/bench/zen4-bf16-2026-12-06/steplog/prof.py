"""python prof.py METHOD BATCH OUT.txt: in-process engine, the bench's warm-up then one timed chat
(2x BATCH prompts x 64 tokens) under cProfile; the per-decode-step cost of the main parts."""

import cProfile
import io
import os
import pstats
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steprun import speculative_config  # noqa: E402 (the same engines as the step log)
from vllm import SamplingParams

from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.measure import engine
from vllm_clover.bench.prompts import load_prompts, take_prompts


def main():
    method, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    spec = speculative_config(method)
    chats = take_prompts(load_prompts(), max(16, 2 * batch))
    with engine(
        str(fetch_reference_target()), spec, batch, dtype="bfloat16", enforce_eager=True
    ) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        llm.reset_prefix_cache()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
        prof.disable()
        print(method, "wall under profile", round(time.perf_counter() - t0, 2))
    prof.dump_stats(out + ".prof")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(90)
    open(out, "w").write(s.getvalue())


if __name__ == "__main__":
    main()
