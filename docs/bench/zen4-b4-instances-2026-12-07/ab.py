"""One engine at the defaults users get (goodput budget, the target's bfloat16), or vanilla,
timed on MT-Bench first turns x 64 tokens; prints a JSON line per timed run.
usage: python ab.py TAG MODE BATCH CHATS [RUNS] (TAG: vanilla..., floor... (K = 0 at every
step) or any other name, the code tree under test on PYTHONPATH: the default; MODE:
multiprocess / in-process; RUNS: timed runs of the same chats on the one engine, default 1).
`held.py` starts its engines and writes its rows with the functions here."""

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def engine_spec(tag: str) -> dict | None:
    """The speculative_config of the engine a tag names (None: vanilla)."""
    from vllm_clover.bundled import CLOVER2_HEADS

    if tag.startswith("vanilla"):
        return None
    spec = {"method": "clover", "model": str(CLOVER2_HEADS), "num_speculative_tokens": 4}
    if tag.startswith("floor"):  # K = 0 at every step: a speculating engine that only rests
        spec |= {
            "draft_budget": "fixed",
            "num_speculative_tokens_per_batch_size": [[1, 1 << 20, 0]],
        }
    return spec


@contextmanager
def started(tag: str, mode: str, batch: int, num_chats: int) -> Iterator:
    """(llm, chats, greedy): a warmed-up engine of `tag`, its chats and sampling params."""
    from vllm_clover.bench.measure import set_engine_mode

    set_engine_mode(mode)
    from vllm import SamplingParams

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine
    from vllm_clover.bench.prompts import load_prompts, take_prompts

    chats = take_prompts(load_prompts(), num_chats)
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    with engine(str(fetch_reference_target()), engine_spec(tag), batch) as llm:
        llm.chat(chats[:batch], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        yield llm, chats, greedy


def timed_row(llm, prompts, params, **fields) -> dict:
    """One timed run of `prompts` (prefix cache reset first) as a JSON-ready row."""
    import vllm_clover
    from vllm_clover.bench.measure import timed_chat

    llm.reset_prefix_cache()
    run = timed_chat(llm, prompts, params)
    tokens, c = sum(len(t) for t in run.tokens), run.counters
    return {
        "src": vllm_clover.__file__,
        **fields,
        "s": run.seconds,
        "tok": tokens,
        "tps": tokens / run.seconds,
        "steps": c.steps,
        "drafts": c.draft_tokens,
        "accepted": c.accepted,
        "first": [t[:64] for t in run.tokens],
    }


def main() -> None:
    tag, mode, batch, num_chats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fields = {"tag": tag, "mode": mode, "batch": batch, "chats": num_chats}
    with started(tag, mode, batch, num_chats) as (llm, chats, greedy):
        rows = [
            timed_row(llm, chats, greedy, run=n, **fields)
            for n in range(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
        ]
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
