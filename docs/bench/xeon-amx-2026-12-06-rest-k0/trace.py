"""Trace the goodput budget step by step in one fresh in-process engine (bfloat16, Clover-2,
the bench's prompts, 64 tokens each): `python trace.py BATCH RUNS OUT.json`.

Each choice is logged with its kind (warm-up, explored, best) and the predicted goodput per
K; each observed step with its time (ms), tokens, K, batch, requests verified and the drafts
they had accepted and made.
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
from vllm_clover.budget import goodput  # noqa: E402
from vllm_clover.bundled import CLOVER2_HEADS  # noqa: E402

batch, runs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
log = []
choose, observe = goodput.GoodputController.choose, goodput.GoodputController.observe_step


def traced_choose(self, b):
    warm, explored = sum(self.log.warmup.values()), sum(self.log.explored.values())
    k = choose(self, b)
    kind = "best"
    if sum(self.log.warmup.values()) > warm:
        kind = "warm"
    elif sum(self.log.explored.values()) > explored:
        kind = "expl"
    gp = self.predicted_goodput(b) if self.decode_steps >= 6 else None
    log.append(
        dict(b=b, k=k, kind=kind, gp=None if gp is None else [round(float(x), 1) for x in gp])
    )
    return k


def traced_observe(self, seconds, tokens, k, batch, verified, *args, **kwargs):
    log.append(
        dict(
            obs=1,
            s=round(seconds * 1e3, 1),
            n=tokens,
            k=k,
            b=batch,
            v=len(verified),
            acc=sum(m for _, m in verified),
            dr=sum(n for n, _ in verified),
        )
    )
    return observe(self, seconds, tokens, k, batch, verified, *args, **kwargs)


goodput.GoodputController.choose = traced_choose
goodput.GoodputController.observe_step = traced_observe
spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
chats = take_prompts(load_prompts(), max(16, 2 * batch))
with engine(
    str(fetch_reference_target()), spec, batch, dtype="bfloat16", enforce_eager=True
) as llm:
    for r in range(runs):
        start = time.perf_counter()
        outputs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print("run", r, "wall", round(wall, 2), "tok/s", round(tokens / wall, 1), flush=True)
        log.append(dict(run=r, wall=wall, tps=tokens / wall))
with open(out, "w") as f:
    json.dump(log, f)
