"""One engine held for many timed runs, so that methods alternate run by run without a
fresh start each time. usage: python held.py TAG MODE BATCH CHATS DIR (TAG: vanilla...,
floor... (K = 0 at every step) or any other name: the default)
Waits for DIR/go-TAG-N (N = 0, 1, ...), runs the timed chat, appends a JSON line to
DIR/TAG.jsonl, then writes DIR/done-TAG-N; DIR/stop ends it."""

import json
import os
import sys
import time


def wait_for(*paths: str) -> str:
    while True:
        for path in paths:
            if os.path.exists(path):
                return path
        time.sleep(0.2)


def main() -> None:
    from vllm_clover.bench.measure import set_engine_mode

    tag, mode, batch, num_chats, folder = sys.argv[1:6]
    batch, num_chats = int(batch), int(num_chats)
    set_engine_mode(mode)
    from vllm import SamplingParams

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.bundled import CLOVER2_HEADS

    spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    if tag.startswith("floor"):  # K = 0 at every step: a speculating engine that only rests
        spec |= {
            "draft_budget": "fixed",
            "num_speculative_tokens_per_batch_size": [[1, 1 << 20, 0]],
        }
    spec = None if tag.startswith("vanilla") else spec
    chats = take_prompts(load_prompts(), num_chats)
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    with engine(str(fetch_reference_target()), spec, batch) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        open(f"{folder}/ready-{tag}", "w").close()
        n = 0
        while wait_for(f"{folder}/go-{tag}-{n}", f"{folder}/stop").endswith(f"-{n}"):
            llm.reset_prefix_cache()
            run = timed_chat(llm, chats, greedy)
            c = run.counters
            row = {
                "tag": tag,
                "run": n,
                "s": run.seconds,
                "tok": sum(map(len, run.tokens)),
                "steps": c.steps,
                "drafts": c.draft_tokens,
                "accepted": c.accepted,
                "src": __import__("vllm_clover").__file__,
            }
            row["tps"] = row["tok"] / row["s"]
            with open(f"{folder}/{tag}.jsonl", "a") as out:
                out.write(json.dumps(row) + "\n")
            open(f"{folder}/done-{tag}-{n}", "w").close()
            n += 1


if __name__ == "__main__":
    main()
