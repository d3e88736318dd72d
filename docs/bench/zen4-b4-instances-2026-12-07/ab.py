"""One engine at the defaults users get (goodput budget, the target's bfloat16), or vanilla,
timed on MT-Bench first turns x 64 tokens; prints a JSON line.
usage: python ab.py TAG MODE BATCH CHATS (TAG: vanilla, or the name of the code tree under
test, on PYTHONPATH; MODE: multiprocess / in-process)."""

import json
import sys


def main() -> None:
    from vllm_clover.bench.measure import set_engine_mode

    tag, mode, batch, num_chats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    set_engine_mode(mode)
    from vllm import SamplingParams

    import vllm_clover
    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.bundled import CLOVER2_HEADS

    spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    spec = None if tag.startswith("vanilla") else spec
    chats = take_prompts(load_prompts(), num_chats)
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    with engine(str(fetch_reference_target()), spec, batch) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        runs = []
        for _ in range(int(sys.argv[5]) if len(sys.argv) > 5 else 1):
            llm.reset_prefix_cache()
            runs.append(timed_chat(llm, chats, greedy))
    for n, run in enumerate(runs):
        emit(tag, mode, batch, num_chats, n, run, vllm_clover.__file__)


def emit(tag, mode, batch, num_chats, n, run, src) -> None:
    tokens, c = sum(len(t) for t in run.tokens), run.counters
    row = {
        "src": src,
        "run": n,
        "tag": tag,
        "mode": mode,
        "batch": batch,
        "chats": num_chats,
        "s": run.seconds,
        "tok": tokens,
        "tps": tokens / run.seconds,
        "steps": c.steps,
        "drafts": c.draft_tokens,
        "accepted": c.accepted,
        "first": [t[:64] for t in run.tokens],
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
