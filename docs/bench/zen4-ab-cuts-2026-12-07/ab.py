"""One Clover-2 engine at the defaults users get (goodput budget, the target's bfloat16),
timed on MT-Bench first turns x 64 tokens; prints a JSON line.
usage: python ab.py TAG MODE BATCH (MODE: multiprocess / in-process; TAG: the code tree
under test, on PYTHONPATH)."""

import json
import sys


def main() -> None:
    from vllm_clover.bench.measure import set_engine_mode

    tag, mode, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    set_engine_mode(mode)
    from vllm import SamplingParams

    import vllm_clover
    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.bundled import CLOVER2_HEADS

    spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    chats = take_prompts(load_prompts(), max(16, batch))
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    with engine(str(fetch_reference_target()), spec, batch) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        llm.reset_prefix_cache()
        run = timed_chat(llm, chats, greedy)
    tokens, c = sum(len(t) for t in run.tokens), run.counters
    row = {
        "src": vllm_clover.__file__,
        "tag": tag,
        "mode": mode,
        "batch": batch,
        "s": run.seconds,
        "tok": tokens,
        "tps": tokens / run.seconds,
        "steps": c.steps,
        "drafts": c.draft_tokens,
        "accepted": c.accepted,
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
