"""Where the default draft budget's time goes under load: one in-process engine, Clover with
the goodput budget, MT-Bench first turns (2 x batch prompts), T = 0, bfloat16 (`--dtype`).

Prints the run's tokens/s, the controller's decisions (warm-up, exploration, its own
choices by batch size), what it has learned (acceptance per position, the step-cost knots,
the predicted tokens/s of each K at a few batch sizes), and every drafting call of the
run: its K, the step's rows, its milliseconds and the Augmenting Block passes it ran (rows,
milliseconds), summed by kind of step (drafting or not, with or without a prompt chunk),
and every step as the budget observed it (K, batch, scheduled tokens, milliseconds); and how
often K = 1 was a close call to K = 0, priced with and without the switch's catch-up.

    python benchmarks/budget_trace.py --batch-size 64 \
        --heads checkpoints/smollm2-135m-instruct-clover2 > trace.txt

``--passes N`` runs the workload N times on the same engine (prefix cache emptied before
each, as `draft_dtype_ab.py --passes` does) and reports the last pass only (the controller's
own counters cover every pass): what a budget that has already learnt does, as on a
long-running server.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter, defaultdict

from vllm_clover.bundled import REFERENCE_HEADS

# (K, step rows, has a prompt chunk, seconds, [(pass rows, seconds)]) per drafting call
CALLS: list[tuple[int, int, bool, float, list[tuple[int, float]]]] = []
# (K, batch, scheduled tokens, seconds, decoded only) per engine step, as the budget saw it
STEPS: list[tuple[int, int, int, float, bool]] = []
# (batch, backlog rows, K = 1 over K = 0 as priced with the backlog, and without) per choice
CHOICES: list[tuple[int, float, float, float]] = []


def trace_steps(budget) -> None:
    """Record every step the goodput budget observes (in this process: in-process engine)."""
    observe = budget.observe_step

    def traced(seconds, tokens, k, batch, verified, **kwargs):
        STEPS.append((k, batch, tokens, seconds, len(verified) == batch))
        observe(seconds, tokens, k, batch, verified, **kwargs)

    budget.observe_step = traced
    choose = budget.choose

    def traced_choice(batch, backlog=0.0):
        ratios = []
        for rows in (backlog, 0.0):
            goodput = budget.predicted_goodput(batch, rows)
            ratios.append(float(goodput[1] / goodput[0]))
        CHOICES.append((batch, backlog, *ratios))
        return choose(batch, backlog)

    budget.choose = traced_choice


def report_choices(margin: float) -> None:
    """How often K = 1 was a close call (within `margin` of K = 0) with and without the
    switch's catch-up of the waiting rows, over the choices made after the warm-up."""
    priced = sum(with_rows >= 1 - margin for _, _, with_rows, _ in CHOICES)
    free = sum(without >= 1 - margin for _, _, _, without in CHOICES)
    backlog = sorted(rows for _, rows, _, _ in CHOICES)
    print(
        f"choices: {len(CHOICES)}; K = 1 within {margin:.0%} of K = 0 in {priced} priced with"
        f" the waiting rows, {free} without; waiting rows median {backlog[len(backlog) // 2]:.0f}"
    )


def report_steps() -> None:
    """Per step: K, batch, tokens, ms; then the decode steps' ms summed by K."""
    print("step K batch tokens ms decode-only:")
    for i, (k, batch, tokens, seconds, decode) in enumerate(STEPS):
        print(i, k, batch, tokens, f"{1e3 * seconds:.1f}", int(decode))
    by_k: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for k, _, _, seconds, decode in STEPS:
        by_k[(k, decode)].append(seconds)
    for (k, decode), times in sorted(by_k.items()):
        print(f"K={k} decode-only={decode}: {len(times)} steps, {1e3 * sum(times):.0f} ms")


def trace_drafter(worker) -> None:
    """(In the worker.) Record each `propose` call and the block passes inside it."""
    drafter = worker.model_runner.drafter
    propose, run_block = drafter.propose, drafter._run_block
    passes: list[tuple[int, float]] = []

    def traced_propose(*args, **kwargs):
        passes.clear()
        started = time.perf_counter()
        drafts = propose(*args, **kwargs)
        seconds = time.perf_counter() - started
        k, requests = drafts.shape[1], drafts.shape[0]
        rows = kwargs["target_token_ids"].shape[0]
        CALLS.append((k, rows, rows > requests * (1 + k), seconds, list(passes)))
        return drafts

    def traced_block(x, slots, positions, cad):
        started = time.perf_counter()
        h0 = run_block(x, slots, positions, cad)
        passes.append((positions.shape[0], time.perf_counter() - started))
        return h0

    drafter.propose, drafter._run_block = traced_propose, traced_block


def deferral_stats(worker) -> dict | None:
    """(In the worker.) The Augmenting Block deferral's counters, rows still parked."""
    deferral = worker.model_runner.drafter.deferral
    if deferral is None:
        return None
    return {**vars(deferral.stats), "still_parked": deferral.parked.rows}


def report_controller(budget) -> None:
    log = budget.log
    print("warm-up K:", dict(log.warmup), "explored K:", dict(log.explored))
    print(f"subset trials: {log.subset_steps} steps, {log.subset_accepted} drafts accepted")
    print("chosen {batch: {K: steps}}:", log.k_by_batch())
    accepted, drafted = budget.acceptance.rates()
    print("accepted per position", accepted.round(3), "drafted", drafted.round(3))
    values = 1e3 * budget.cost.knot_values()
    knots = budget.cost.knots.astype(int).tolist()
    print("f(knots) ms", dict(zip(knots, values[:-4].round(1).tolist(), strict=True)))
    print("g, c, e ms", values[-4:-1].round(3).tolist(), "b us per row", round(1e3 * values[-1], 2))
    for batch in (4, 16, 64):
        print(f"batch {batch}: predicted tokens/s by K", budget.predicted_goodput(batch).round(1))


def log_counts(log) -> dict:
    """The budget log's counters, copied: to subtract one pass's from the next."""
    drafted = Counter({key: n for key, n in log.chosen.items() if key[1] > 0})
    return {
        "chosen K > 0 {(batch, K): steps}": drafted,
        "explored {K: steps}": Counter(log.explored),
        "warm-up {K: steps}": Counter(log.warmup),
        "subset trials": Counter(steps=log.subset_steps),
    }


def report_last_pass(before: dict, after: dict) -> None:
    """Which of the budget's rules chose the last pass's steps with K > 0."""
    for name, counts in after.items():
        print(f"last pass, {name}:", dict(counts - before[name]))


def report_calls() -> None:
    kinds: dict[tuple[bool, bool], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for k, _, prompt_chunk, seconds, passes in CALLS:
        kind = kinds[(k > 0, prompt_chunk)]
        kind[0] += 1
        kind[1] += seconds
        kind[2] += sum(n for n, _ in passes)
        kind[3] += sum(s for _, s in passes)
    for (drafts, prefill), (calls, seconds, rows, block) in sorted(kinds.items()):
        print(
            f"drafts {drafts!s:5} prompt chunk {prefill!s:5}: {calls} calls, {1e3 * seconds:.0f}"
            f" ms; block passes over {rows} rows, {1e3 * block:.0f} ms"
        )
    print("K, step rows, ms, [(pass rows, ms)] of each call:")
    for k, rows, _, seconds, passes in CALLS:
        print(k, rows, f"{1e3 * seconds:.1f}", [(n, round(1e3 * s, 1)) for n, s in passes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--heads", default=str(REFERENCE_HEADS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", help="float32 where the CPU lacks AVX-512")
    parser.add_argument("--passes", type=int, default=1, help="report the last of N passes")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine, timed_chat
    from vllm_clover.bench.prompts import load_prompts, take_prompts

    chats = take_prompts(load_prompts(), 2 * args.batch_size)
    spec = {"method": "clover", "model": args.heads}
    target = str(fetch_reference_target())
    with engine(target, spec, args.batch_size, dtype=args.dtype) as llm:
        llm.chat(chats[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        llm.collective_rpc(trace_drafter)
        budget = llm.llm_engine.engine_core.engine_core.scheduler.clover_budget
        trace_steps(budget)
        sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        for _ in range(args.passes):
            for trace in (CALLS, STEPS, CHOICES):
                trace.clear()
            before = log_counts(budget.log)
            llm.reset_prefix_cache()
            run = timed_chat(llm, chats, sampling)
        tokens = sum(len(t) for t in run.tokens)
        tau = "-" if run.counters.tau is None else f"{run.counters.tau:.3f}"  # None: no drafts
        print(f"{tokens / run.seconds:.1f} tokens/s, {run.counters.steps} steps, tau {tau}")
        report_controller(budget)
        report_last_pass(before, log_counts(budget.log))
        report_choices(budget.config.explore_margin)
        (deferral,) = llm.collective_rpc(deferral_stats)
        print("deferral:", deferral)
    report_calls()
    report_steps()


if __name__ == "__main__":
    main()
