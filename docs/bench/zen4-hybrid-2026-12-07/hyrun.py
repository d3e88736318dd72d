"""python hyrun.py METHOD PROMPTS N: one engine (in-process unless MP=1), a warm-up, then one
timed chat of N prompts x 64 tokens at batch 1, float32, T = 0 (what `bench` times).
METHOD: vanilla | ngram (K 4, n 2-4) | ngramK (K tokens) | lookup (Clover-2 heads +
"lookup": true, fixed K = 4).
Prints tok/s, steps, drafts, accepted, and the lookup's counters; tokens to OUT/METHOD-TAG.json."""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("MP", "0"))
from vllm import SamplingParams

from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.measure import engine
from vllm_clover.bench.prompts import load_prompts, take_prompts
from vllm_clover.bundled import CLOVER2_HEADS


def spec(method):
    if method == "vanilla":
        return None
    if method.startswith("ngram"):  # ngram: K = 4; ngramK: K tokens
        return {
            "method": "ngram",
            "num_speculative_tokens": int(method[5:] or 4),
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    return {
        "method": "clover",
        "model": str(CLOVER2_HEADS),
        "num_speculative_tokens": 4,
        "lookup": True,
    }


def main():
    method, prompts, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    chats = take_prompts(load_prompts(None if prompts == "mt" else prompts), n)
    with engine(
        str(fetch_reference_target()), spec(method), 1, dtype="float32", enforce_eager=True
    ) as llm:
        llm.chat(chats[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        t0 = time.perf_counter()
        outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
        wall = time.perf_counter() - t0
        tok = sum(len(o.outputs[0].token_ids) for o in outs)
        extra = ""
        if method == "lookup":
            from vllm_clover.hybrid.drafter import lookup_counts

            ((v, a, only),) = llm.collective_rpc(lookup_counts)
            rested = llm.collective_rpc(
                lambda w: getattr(w.model_runner.drafter.draft_log, "rested", -1)
            )
            extra = f" lookup_verified {v} lookup_accepted {a} lookup_only {only} rested {rested}"
        m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
        acc = m.get("vllm:spec_decode_num_accepted_tokens")
        dr = m.get("vllm:spec_decode_num_draft_tokens")
        print(
            f"RESULT {method} {os.environ.get('TAG', '')} wall {wall:.2f} tok/s {tok / wall:.2f} "
            f"tok {tok} drafts {dr} accepted {acc}{extra}",
            flush=True,
        )
        out = os.environ.get("OUT")
        if out:
            with open(os.path.join(out, f"{method}-{os.environ.get('TAG', '')}.json"), "w") as f:
                json.dump([list(o.outputs[0].token_ids) for o in outs], f)


if __name__ == "__main__":
    main()
