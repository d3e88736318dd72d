"""One multiprocess engine at the K = 0 floor (or vanilla), its engine step split by phase.

Used for the prefix_block_drop A/B (docs/benchmarks.md, 2026-11-29): the bench's workload
(twice B MT-Bench first turns as chats, 64 tokens, bfloat16, prefix cache emptied after the
warm-up), the runner's phases timed as benchmarks/step_profile.py times them, and the prompt
tokens the prefix cache served. One engine per invocation, so that an older checkout can run
the same script (`PYTHONPATH=OLD_CHECKOUT`, run from outside this one):

    python floor_split.py 64 vanilla
    python floor_split.py 64 checkpoints/smollm2-135m-instruct-clover2

prints one JSON line.
"""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the timers


PROMPT, CACHED = "vllm:prompt_tokens", "vllm:prompt_tokens_cached"


def counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


def main(batch: int, heads: str) -> dict:
    from vllm import SamplingParams

    import vllm_clover
    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.config import FLOOR_SCHEDULE
    from vllm_clover.bench.measure import engine, read_counters
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.integration.patches.hooks import STEP_PHASES, method_times, time_methods

    spec = None
    if heads != "vanilla":
        spec = {"method": "clover", "model": heads, "num_speculative_tokens": 1}
        spec.update(draft_budget="fixed", draft_confidence=0)
        spec["num_speculative_tokens_per_batch_size"] = FLOOR_SCHEDULE
    chats = take_prompts(load_prompts(), max(8, 2 * batch))
    params = SamplingParams(temperature=0.0, max_tokens=64)
    with engine(str(fetch_reference_target()), spec, batch, dtype="bfloat16") as llm:
        llm.chat(chats, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        llm.reset_prefix_cache()
        llm.collective_rpc(time_methods, args=(tuple(STEP_PHASES),))
        before = read_counters(llm)
        prompt0, cached0 = counter(llm, PROMPT), counter(llm, CACHED)
        started = time.perf_counter()
        llm.chat(chats, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        steps = (read_counters(llm) - before).steps
        prompt1, cached1 = counter(llm, PROMPT), counter(llm, CACHED)
        (times,) = llm.collective_rpc(method_times)
    ms = {name: round(1e3 * s / steps, 2) for name, (s, _) in times.items()}
    run = {"seconds": round(elapsed, 2), "steps": steps, "step_ms": round(1e3 * elapsed / steps, 2)}
    prompts = {"prompt_tokens": prompt1 - prompt0, "cached": cached1 - cached0}
    return {"code_at": vllm_clover.__file__, "heads": heads, "batch": batch, **run, **prompts, **ms}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2])))
