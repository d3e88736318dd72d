"""Draft-row scoring formats end to end: vanilla and Clover with each `CLOVER_DRAFT_DTYPE`,
in-process engines alternating round by round (each in its own forked process, as the bench
runs them), T = 0, MT-Bench first turns, 64 new tokens.

`vllm-clover bench` reads the format from the environment once per invocation, so two
invocations compare formats across minutes of host drift; here every round runs vanilla and
then each format back to back, and each ratio is to its own round's vanilla. Prints, per
format, the median tokens/s ratio with its range, the median drafting milliseconds per engine
step and whether every greedy output equalled vanilla's; writes the runs as JSON.

    python benchmarks/draft_dtype_ab.py --batch-size 4 --rounds 5 \
        --heads checkpoints/smollm2-135m-instruct-clover --out ab.json

A format may carry flags after colons: ``:torch-linears`` (e.g. ``auto:torch-linears``)
leaves the head network's linear layers to PyTorch instead of vLLM's packed GEMM
(``cpu_gemm.pack_linears``), to time what packing them buys; ``:no-defer`` runs the
Augmenting Block at every step (``defer_block`` false, ``deferred_block.py``), to time what
deferring it on steps that draft nothing buys. ``--dtype bfloat16`` runs the target (and the
heads) in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from vllm_clover.bundled import REFERENCE_HEADS


def one_engine(job: tuple[int, str, str | None, str]) -> dict:
    """(In a child.) One engine's timed run: vanilla when the format is None."""
    batch, heads, draft_format, dtype = job
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    flags = []
    if draft_format is not None:
        draft_dtype, *flags = draft_format.split(":")
        os.environ["CLOVER_DRAFT_DTYPE"] = draft_dtype
        if "torch-linears" in flags:  # this child only: the engine runs in this process
            from vllm_clover.integration import model

            model.pack_linears = lambda *modules: 0
    from vllm import SamplingParams

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine, install_drafting_timer, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts

    chats = take_prompts(load_prompts(), max(8, 2 * batch))
    spec = None if draft_format is None else {"method": "clover", "model": heads}
    if spec is not None and "no-defer" in flags:
        spec["defer_block"] = False
    with engine(str(fetch_reference_target()), spec, batch, dtype=dtype) as llm:
        if spec is not None:
            install_drafting_timer(llm)
        llm.chat(chats[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        run = timed_chat(llm, chats, SamplingParams(temperature=0.0, max_tokens=64))
    return {
        "tokens_per_second": sum(len(t) for t in run.tokens) / run.seconds,
        "steps": run.counters.steps,
        "drafting_seconds": run.counters.drafting_seconds,
        "tau": run.counters.tau,
        "tokens": run.tokens,
    }


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per format: tokens/s ratio to the same round's vanilla (median, range), drafting ms
    per step (median) and greedy equality with vanilla over every round."""
    vanilla = runs["vanilla"]
    summary = {}
    for name, mine in runs.items():
        if name == "vanilla":
            continue
        ratios = [
            m["tokens_per_second"] / v["tokens_per_second"]
            for m, v in zip(mine, vanilla, strict=True)
        ]
        summary[name] = {
            "ratio_to_vanilla": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "drafting_ms_per_step": statistics.median(
                1e3 * m["drafting_seconds"] / m["steps"] for m in mine
            ),
            "equal_to_vanilla": all(
                m["tokens"] == v["tokens"] for m, v in zip(mine, vanilla, strict=True)
            ),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heads", default=str(REFERENCE_HEADS))
    parser.add_argument("--formats", nargs="+", default=["auto", "float16"])
    parser.add_argument("--dtype", default="float32", help="the target's dtype")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from vllm_clover.bench.runner import prepare_engine_server, run_isolated

    prepare_engine_server()
    runs: dict[str, list[dict]] = {"vanilla": [], **{f: [] for f in args.formats}}
    for round_ in range(args.rounds):
        for name in runs:
            fmt = None if name == "vanilla" else name
            result = run_isolated(one_engine, (args.batch_size, args.heads, fmt, args.dtype))
            runs[name].append(result)
            print(round_, name, f"{result['tokens_per_second']:.2f} tokens/s", flush=True)
    summary = summarize(runs)
    print(json.dumps(summary, indent=1))
    for results in runs.values():
        for result in results:
            del result["tokens"]
    report = {"args": {**vars(args), "out": str(args.out)}, "runs": runs, "summary": summary}
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
