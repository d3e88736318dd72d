"""Milliseconds per engine step in each phase, vanilla or Clover with K = 0 at every step.

    python phases.py BATCH vanilla|k0 RUNS

One in-process engine, bfloat16, eager, the bench's prompts (MT-Bench first turns, at least
16 and 2x the batch, 64 new tokens), RUNS runs of the same prompts; k0 is the default
Clover-2 heads with a `num_speculative_tokens_per_batch_size` table of K = 0, so the
Augmenting Block rests after its first steps. Each phase's wall time is summed over a run and
divided by its engine steps.
"""

import collections
import functools
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.executor.uniproc_executor import UniProcExecutor  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from vllm_clover.assets.target import fetch_reference_target  # noqa: E402
from vllm_clover.bench.measure import engine  # noqa: E402
from vllm_clover.bench.prompts import load_prompts, take_prompts  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402

TOTAL = collections.Counter()
CALLS = collections.Counter()
PHASES = (
    (EngineCore, "step", "core.step"),
    (EngineCore, "post_step", "core.post_step"),
    (Scheduler, "schedule", "schedule"),
    (Scheduler, "update_from_output", "update"),
    (UniProcExecutor, "execute_model", "exec"),
    (UniProcExecutor, "sample_tokens", "sample"),
    (GPUModelRunner, "_model_forward", "forward"),
    (GPUModelRunner, "_prepare_inputs", "prep"),
    (GPUModelRunner, "_bookkeeping_sync", "bookkeep"),
    (GPUModelRunner, "propose_draft_token_ids", "propose"),
)


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)  # the plugin's patches read the signature through it
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTAL[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def main(batch: int, method: str, runs: int) -> None:
    for owner, name, label in PHASES:
        timed(owner, name, label)
    spec = None
    if method == "k0":
        spec = {
            "method": "clover",
            "model": str(CLOVER2_HEADS),
            "num_speculative_tokens": 4,
            "num_speculative_tokens_per_batch_size": [[1, 256, 0]],
        }
    chats = take_prompts(load_prompts(), max(16, 2 * batch))
    target = str(fetch_reference_target())
    with engine(target, spec, batch, dtype="bfloat16", enforce_eager=True) as llm:
        for run in range(runs):
            TOTAL.clear()
            CALLS.clear()
            start = time.perf_counter()
            params = SamplingParams(temperature=0, max_tokens=64)
            outputs = llm.chat(chats, params, use_tqdm=False)
            wall = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            steps = CALLS["core.step"]
            phases = " ".join(f"{k}={v * 1e3 / steps:.2f}" for k, v in sorted(TOTAL.items()))
            print(f"run {run} {method} tok/s {tokens / wall:.1f} steps {steps} {phases}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
