"""Draft-row scoring formats end to end: vanilla and Clover with each `CLOVER_DRAFT_DTYPE`,
in-process engines alternating round by round (each in its own forked process, as the bench
runs them; each round starts one engine later than the round before), T = 0, MT-Bench first
turns, 64 new tokens.

`vllm-clover bench` reads the format from the environment once per invocation, so two
invocations compare formats across minutes of host drift; here every round runs vanilla and
each format back to back, and each ratio is to its own round's vanilla. Prints, per
format, the median tokens/s ratio with its range, the median drafting milliseconds per engine
step and whether every greedy output equalled vanilla's; writes the runs as JSON.

    python benchmarks/draft_dtype_ab.py --batch-size 4 --rounds 5 \
        --heads checkpoints/smollm2-135m-instruct-clover --out ab.json

A format may carry flags after colons: ``:torch-linears`` (e.g. ``auto:torch-linears``)
leaves the head network's linear layers to PyTorch instead of vLLM's packed GEMM
(``cpu_gemm.pack_linears``), to time what packing them buys; ``:no-defer`` runs the
Augmenting Block at every step (``defer_block`` false, ``deferred_block.py``), to time what
deferring it on steps that draft nothing buys; ``:kN`` (e.g. ``auto:k1``) drafts a fixed N
tokens per request at every step (``draft_budget`` "fixed", ``num_speculative_tokens`` N;
``:k0`` none, speculation configured but off) instead of the goodput budget's choice, to
time what that choice is worth; ``:FIELD=VALUE`` (e.g. ``auto:explore=0``) sets a field of
the goodput budget's `GoodputConfig` in that engine, to time a controller setting (an
experiment, not a user option). ``--passes N``
times the workload N times on each engine: the first pass includes what the goodput budget
spends learning (its warm-up and trials), the later ones show a budget that has learnt, as
on a long-running server. ``--dtype bfloat16`` runs the target (and the
heads) in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from vllm_clover.bundled import REFERENCE_HEADS


def one_engine(job: tuple[int, str, str | None, str, int]) -> list[dict]:
    """(In a child.) One engine's timed runs, `passes` of them back to back on the same
    engine (prefix cache emptied before each): vanilla when the format is None."""
    batch, heads, draft_format, dtype, passes = job
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
    from vllm_clover.bench.config import FLOOR_SCHEDULE
    from vllm_clover.bench.measure import engine, install_drafting_timer, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts

    chats = take_prompts(load_prompts(), max(8, 2 * batch))
    spec = None if draft_format is None else {"method": "clover", "model": heads}
    if spec is not None and "no-defer" in flags:
        spec["defer_block"] = False
    for flag in flags:
        if flag[:1] == "k" and flag[1:].isdigit():
            spec |= {"draft_budget": "fixed", "num_speculative_tokens": int(flag[1:]) or 1}
            if flag == "k0":  # vLLM wants num_speculative_tokens >= 1: a table of zeros
                spec["num_speculative_tokens_per_batch_size"] = FLOOR_SCHEDULE
    overrides = dict(flag.split("=", 1) for flag in flags if "=" in flag)
    if overrides:
        override_goodput_config(overrides)
    with engine(str(fetch_reference_target()), spec, batch, dtype=dtype) as llm:
        if spec is not None:
            install_drafting_timer(llm)
        llm.chat(chats[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        runs = []
        for _ in range(passes):
            llm.reset_prefix_cache()
            runs.append(timed_chat(llm, chats, SamplingParams(temperature=0.0, max_tokens=64)))
    return [
        {
            "tokens_per_second": sum(len(t) for t in run.tokens) / run.seconds,
            "steps": run.counters.steps,
            "drafting_seconds": run.counters.drafting_seconds,
            "tau": run.counters.tau,
            "tokens": run.tokens,
        }
        for run in runs
    ]


def override_goodput_config(overrides: dict[str, str]) -> None:
    """(In a child whose engine runs in-process.) Build every goodput budget with these
    `GoodputConfig` fields (strings, converted to each field's default's type)."""
    import dataclasses

    from vllm_clover.integration.patches import scheduling

    build = scheduling.goodput_controller

    def with_overrides(vllm_config):
        controller = build(vllm_config)
        if controller is None:
            return None
        config = controller.config
        values = {k: type(getattr(config, k))(float(v)) for k, v in overrides.items()}
        return type(controller)(dataclasses.replace(config, **values))

    scheduling.goodput_controller = with_overrides


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
    parser.add_argument(
        "--passes", type=int, default=1, help="timed runs per engine (the later: warm budget)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from vllm_clover.bench.runner import prepare_engine_server, run_isolated

    prepare_engine_server()
    # name -> one list per round of the engine's passes
    runs: dict[str, list[list[dict]]] = {"vanilla": [], **{f: [] for f in args.formats}}
    names = list(runs)
    for round_ in range(args.rounds):
        # each round starts one engine later, so that no engine always runs first (on a
        # machine where the engines of a round slow down one after another, that would bias
        # every ratio); each ratio is still to its own round's vanilla
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            fmt = None if name == "vanilla" else name
            job = (args.batch_size, args.heads, fmt, args.dtype, args.passes)
            passes = run_isolated(one_engine, job)
            runs[name].append(passes)
            rates = ", ".join(f"{p['tokens_per_second']:.2f}" for p in passes)
            print(round_, name, f"tokens/s by pass: {rates}", flush=True)
    by_pass = [
        summarize({name: [passes[i] for passes in rounds] for name, rounds in runs.items()})
        for i in range(args.passes)
    ]
    print(json.dumps(by_pass, indent=1))
    for rounds in runs.values():
        for passes in rounds:
            for result in passes:
                del result["tokens"]
    report = {
        "args": {**vars(args), "out": str(args.out)},
        "runs": runs,
        "summary": by_pass[-1],  # the last pass: the engine's budget has learnt the most
        "summary_by_pass": by_pass,
    }
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
