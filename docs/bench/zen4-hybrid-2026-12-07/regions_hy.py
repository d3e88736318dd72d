"""PYTHONPATH=TREE python regions_hy.py METHOD BATCH PROMPTS: in-process, float32, a warm-up
then one timed chat (16 prompts of PROMPTS x 64 tokens); wall time of the step's parts, per
call, summed. METHOD as in hyrun.py (vanilla | ngram | lookup)."""

import collections
import functools
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hyrun import spec as speculative_config
from vllm import SamplingParams
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.measure import engine
from vllm_clover.bench.prompts import load_prompts, take_prompts
from vllm_clover.core.proposer import CloverProposer
from vllm_clover.hybrid.drafter import HybridDrafter

T = collections.defaultdict(float)
N = collections.Counter()


def wrap(cls, name, label=None):
    f = getattr(cls, name)
    label = label or f"{cls.__name__}.{name}"

    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label] += time.perf_counter() - t
            N[label] += 1

    setattr(cls, name, g)


for n in [
    "propose",
    "_augmenting_pass",
    "_draft",
    "set_inputs_first_pass",
    "build_per_group_and_layer_attn_metadata",
    "build_model_inputs_first_pass",
    "_determine_batch_execution_and_padding",
    "idle_step",
]:
    wrap(CloverProposer, n)
for n in ["plan", "choose", "takes_all"]:
    wrap(HybridDrafter, n)
wrap(CloverProposer, "_step_tokens")
for n in [
    "execute_model",
    "sample_tokens",
    "propose_draft_token_ids",
    "_prepare_inputs",
    "take_draft_token_ids",
    "_model_forward",
    "_sample",
]:
    if hasattr(GPUModelRunner, n):
        wrap(GPUModelRunner, n)


def wrap_model(llm):
    def f(worker):
        d = worker.model_runner.drafter
        m = d.model
        for attr, obj in [("fuse", m), ("forward", m), ("propose", m.heads)]:
            orig = getattr(obj, attr)
            label = f"model.{attr}"

            def g(*a, _o=orig, _l=label, **k):
                t = time.perf_counter()
                try:
                    return _o(*a, **k)
                finally:
                    T[_l] += time.perf_counter() - t
                    N[_l] += 1

            setattr(obj, attr, g)

    llm.collective_rpc(f)


method, batch = sys.argv[1], int(sys.argv[2])
chats = take_prompts(load_prompts(sys.argv[3]), 16)
with engine(
    str(fetch_reference_target()),
    speculative_config(method),
    batch,
    dtype="float32",
    enforce_eager=True,
) as llm:
    if method == "lookup":
        wrap_model(llm)
    llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    T.clear()
    N.clear()
    t0 = time.perf_counter()
    outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    wall = time.perf_counter() - t0
tok = sum(len(o.outputs[0].token_ids) for o in outs)
print(method, batch, "wall", round(wall, 2), "tok/s", round(tok / wall, 1))
steps = N.get("GPUModelRunner.execute_model", 1)
for k in sorted(T, key=T.get, reverse=True):
    total, per_step, per_call = T[k] * 1e3, T[k] / steps * 1e3, T[k] / N[k] * 1e3
    print(
        f"{k:55s} calls {N[k]:5d}  total {total:8.0f} ms  per step {per_step:6.2f} ms  "
        f"per call {per_call:6.2f}"
    )
