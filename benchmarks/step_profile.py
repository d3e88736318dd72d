"""Where a speculative step goes: one engine step split into its phases, vanilla vs Clover.

For each batch size B, vanilla decoding and Clover with exactly K drafts per request (K fixed,
no confidence stop, so every verification step runs B * (1 + K) tokens through the target)
run the same B fixed-length requests on an in-process engine. The model runner's methods are
timed inside the engine (the ledgered hook `runner_timers`, `hooks.STEP_PHASES`), and the
target's forward is split by operator with torch.profiler:

    step          wall seconds per engine step (timed generate / engine steps)
    forward       _model_forward: the target's layers, split into
                    matmul     oneDNN / aten matrix products (q/k/v/o, gate/up/down)
                    attention  the paged-attention kernel and the KV-cache write
                    other      norms, rotary embedding, activations, copies
    logits+state  execute_model - _prepare_inputs - _model_forward: the LM head over the
                  sampled positions, attention metadata, request-state updates
    input prep    _prepare_inputs
    sampling      _sample: the sampler, or the rejection sampler over the drafts
    drafting      propose_draft_token_ids (Clover: the head loop)
    bookkeeping   sample_tokens - _sample - drafting
    engine        step - execute_model - sample_tokens: scheduler, output processing

Clover K=0 is a speculative engine that never drafts (what a step costs with speculation
configured but off); its Augmenting Block's rows wait for a step that drafts, which never
comes (``deferred_block.py``). Clover K=0 no-defer runs the block at every step anyway
(``defer_block`` false), what such a step cost before deferral.

    python benchmarks/step_profile.py --batch-sizes 1 4 16 64 --out docs/bench/step-profile

`--tree TREE` (repeatable) adds a row per token tree (``speculative_token_tree``, every node
drafted at every step), named ``clover tree<N>`` after its node count; `--goodput` a row of
Clover's defaults (``clover goodput``). `--workload mtbench` runs the bench's requests
instead of fixed-length ones: twice B MT-Bench first turns as chats, whose long prompts
make prefill a large share of the run. `--engine multiprocess` runs vLLM's default
multiprocess engine (the engine core and the model in a process of their own, what `vllm
serve` and `LLM` give a user); the phases are timed in that process alike, but torch.profiler
in this one cannot see its operators, so the forward is not split there (its columns read
-, null in the JSON).
Every row also counts the prompt tokens and those the prefix cache served.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch

from vllm_clover.bundled import REFERENCE_HEADS
from vllm_clover.tree.spec import TokenTree

FORWARD_SCOPE = "step_profile::forward"
SPLIT = ("matmul", "attention", "other")  # the forward's operator classes
PROMPT, CACHED = "vllm:prompt_tokens", "vllm:prompt_tokens_cached"
MATMUL_MARKERS = ("mm", "linear", "matmul", "onednn", "gemm")
ATTENTION_MARKERS = ("attention", "attn", "reshape_and_cache")
# vLLM's batch-size table (num_speculative_tokens_per_batch_size) at K = 0 for any batch size
FLOOR_SCHEDULE = [[1, 1 << 20, 0]]


def label_forward(worker) -> None:
    """Mark every target forward for the profiler (after the timers, so both see it)."""
    runner = worker.model_runner
    inner = runner._model_forward

    def labelled(*args, **kwargs):
        with torch.profiler.record_function(FORWARD_SCOPE):
            return inner(*args, **kwargs)

    runner._model_forward = labelled


def op_class(name: str) -> str:
    lowered = name.lower()
    if any(marker in lowered for marker in ATTENTION_MARKERS):
        return "attention"
    if any(marker in lowered for marker in MATMUL_MARKERS):
        return "matmul"
    return "other"


def forward_split(events) -> dict[str, float]:
    """Self CPU seconds per op class over the events inside FORWARD_SCOPE ranges."""
    split = dict.fromkeys(SPLIT, 0.0)
    for event in events:
        parent, inside = event.cpu_parent, False
        while parent is not None:
            if parent.name == FORWARD_SCOPE:
                inside = True
                break
            parent = parent.cpu_parent
        if inside:
            split[op_class(event.name)] += event.self_cpu_time_total / 1e6
    return split


def workload(name: str, batch: int, max_tokens: int, temperature: float):
    """(run(llm, params), params): `dragons`, `batch` one-line prompts run to exactly
    `max_tokens`; `mtbench`, twice `batch` MT-Bench first turns as chats (the bench's
    prompts: long chat prompts, answers that may stop early)."""
    from vllm import SamplingParams

    from vllm_clover.bench.prompts import load_prompts, take_prompts

    if name == "mtbench":
        chats = take_prompts(load_prompts(), max(8, 2 * batch))
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        return (lambda llm, p: llm.chat(chats, p, use_tqdm=False)), params
    prompts = [f"Write a long story about dragon number {i}." for i in range(batch)]
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    return (lambda llm, p: llm.generate(prompts, p, use_tqdm=False)), params


def measure(target: str, spec: dict | None, batch: int, args, temperature: float) -> dict:
    """Per-step milliseconds of every phase for `batch` requests of `args.workload`
    sampled at `temperature` (Clover's chains draw their drafts at T > 0, its default)."""
    from vllm import SamplingParams

    from vllm_clover.bench.measure import engine, metric_total, read_counters
    from vllm_clover.patches.hooks import STEP_PHASES, method_times, time_methods

    run, params = workload(args.workload, batch, args.max_tokens, temperature)
    with engine(target, spec, batch, dtype=args.dtype) as llm:
        run(llm, SamplingParams(max_tokens=4))  # warm-up
        # as the bench does: a warm-up that cached the prompts would make every request a
        # prefix hit, and the timed run would prefill almost nothing
        llm.reset_prefix_cache()
        llm.collective_rpc(time_methods, args=(tuple(STEP_PHASES),))
        before = read_counters(llm)
        prompts = {name: metric_total(llm, name) for name in (PROMPT, CACHED)}
        started = time.perf_counter()
        run(llm, params)
        elapsed = time.perf_counter() - started
        counters = read_counters(llm) - before
        prompts = {name: metric_total(llm, name) - value for name, value in prompts.items()}
        (times,) = llm.collective_rpc(method_times)
        split = {}  # the multiprocess engine's operators run where no profiler here sees them
        if args.engine == "in-process":
            llm.collective_rpc(label_forward)
            profiled = SamplingParams(temperature=temperature, max_tokens=12, ignore_eos=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                run(llm, profiled)
            split = forward_split(prof.events())
    row = phases(elapsed, counters.steps, times, split, counters.tau)
    return {**row, "prompt_tokens": prompts[PROMPT], "cached_tokens": prompts[CACHED]}


def phases(elapsed, steps, times, split, tau) -> dict:
    """Milliseconds per engine step of each phase (see the module docstring)."""
    per_step = {name: 1e3 * seconds / steps for name, (seconds, _) in times.items()}
    forward = per_step["_model_forward"]
    profiled = sum(split.values()) or 1.0
    row = {
        "step": 1e3 * elapsed / steps,
        "forward": forward,
        **{f"forward_{k}": forward * split[k] / profiled if split else None for k in SPLIT},
        "logits+state": per_step["execute_model"] - per_step["_prepare_inputs"] - forward,
        "input prep": per_step["_prepare_inputs"],
        "sampling": per_step["_sample"],
        "drafting": per_step.get("propose_draft_token_ids", 0.0),
        "steps": steps,
        "tau": tau,
    }
    row["bookkeeping"] = per_step["sample_tokens"] - row["sampling"] - row["drafting"]
    row["engine"] = row["step"] - per_step["execute_model"] - per_step["sample_tokens"]
    return row


COLUMNS = (
    "step",
    "forward",
    "forward_matmul",
    "forward_attention",
    "forward_other",
    "logits+state",
    "input prep",
    "sampling",
    "drafting",
    "bookkeeping",
    "engine",
)


def clover_spec(heads: str, k: int | None) -> dict | None:
    """Exactly k drafts per request at every step (no confidence stop); k = 0: a speculative
    engine that never drafts (vLLM's batch-size table pinned to 0); None: vanilla."""
    if k is None:
        return None
    spec = {"method": "clover", "model": heads, "num_speculative_tokens": max(k, 1)}
    spec.update(draft_budget="fixed", draft_confidence=0)
    if k == 0:
        spec["num_speculative_tokens_per_batch_size"] = FLOOR_SCHEDULE
    return spec


def tree_spec(heads: str, tree: str) -> dict:
    """Every node of ``tree`` drafted and verified at every step."""
    return {"method": "clover", "model": heads, "speculative_token_tree": tree}


def configurations(heads: str, ks: list[int], trees: list[str], goodput: bool = False):
    """(method name, speculative_config) in the order they run at each batch size."""
    yield "vanilla", None
    if goodput:  # what a user gets: K chosen per step, the checkpoint's confidence stop
        yield "clover goodput", {"method": "clover", "model": heads}
    for k in [0, *ks]:
        yield f"clover K={k}", clover_spec(heads, k)
        if k == 0:  # what deferring the Augmenting Block saves (heads without one: the same)
            yield "clover K=0 no-defer", {**clover_spec(heads, 0), "defer_block": False}
    for text in trees:
        nodes = TokenTree.parse(text).num_nodes
        yield f"clover tree{nodes}", tree_spec(heads, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    parser.add_argument("--tree", action="append", default=[], help="a token tree to add")
    parser.add_argument("--heads", default=str(REFERENCE_HEADS))
    parser.add_argument("--dtype", default="float32", help="the target's (float32: the tests')")
    parser.add_argument("--out", type=Path, default=Path("step-profile"))
    parser.add_argument("--workload", choices=("dragons", "mtbench"), default="dragons")
    parser.add_argument("--goodput", action="store_true", help="add Clover's default budget")
    parser.add_argument("--engine", choices=("in-process", "multiprocess"), default="in-process")
    args = parser.parse_args()
    if args.engine == "multiprocess":  # before vLLM reads them
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the timers

    from vllm_clover.assets.target import fetch_reference_target

    target = str(fetch_reference_target())
    rows = []
    for batch, temperature in itertools.product(args.batch_sizes, args.temperatures):
        for method, spec in configurations(args.heads, args.ks, args.tree, args.goodput):
            row = {"batch": batch, "T": temperature, "method": method, "dtype": args.dtype}
            row.update(workload=args.workload, engine_mode=args.engine)
            row.update(measure(target, spec, batch, args, temperature))
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_profile.json").write_text(json.dumps(rows, indent=1) + "\n")
    header = "| batch | T | method | " + " | ".join(COLUMNS) + " | tau |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 4)]
    for row in rows:
        cells = " | ".join("-" if row[c] is None else f"{row[c]:.1f}" for c in COLUMNS)
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        lines.append(f"| {row['batch']} | {row['T']:g} | {row['method']} | {cells} | {tau} |")
    (args.out / "step_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
