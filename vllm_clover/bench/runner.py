"""Run the benchmark: one engine per (round, engine mode, batch size, method), serving every
temperature, each in a child of a fork server that imported vLLM once; rounds alternate the
engines. How it works: docs/design/engine-layer.md, "Engines in child processes"."""

from __future__ import annotations

import multiprocessing
import os
import shlex
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_clover.bench.config import BenchConfig, BenchError, Method, ignores_eos
from vllm_clover.bench.measure import (
    Run,
    engine,
    install_drafting_timer,
    set_engine_mode,
    timed_chat,
)
from vllm_clover.bench.prompts import Chat, load_prompts, take_prompts
from vllm_clover.bench.report import round_key, round_vanillas
from vllm_clover.bench.ties import VanillaRerun, first_difference, rerun_vanilla

WARM_UP_TOKENS = 8


@dataclass(frozen=True)
class EngineJob:
    """What one engine does: warm up, then one timed run per temperature."""

    target: str
    method: Method
    batch_size: int
    chats: list[Chat]
    temperatures: tuple[float, ...]
    max_tokens: int
    repeat: int = 0  # the round
    engine_mode: str = "in-process"  # ENGINE_MODES
    dtype: str = "float32"  # the target's
    ignore_eos: str = "auto"  # EOS_POLICIES
    compiled: bool = False  # the target under vLLM's torch.compile mode, else eager


def run_engine_job(job: EngineJob) -> tuple[dict[float, Run], dict[str, Any]]:
    """Start the engine, warm it up on a full batch, time `chats` at each temperature (the
    prefix cache emptied before each); the runs by temperature and the engine settings."""
    from vllm import SamplingParams

    set_engine_mode(job.engine_mode)  # (a child process per engine)
    spec = job.method.speculative_config()
    eager = not job.compiled
    with engine(job.target, spec, job.batch_size, dtype=job.dtype, enforce_eager=eager) as llm:
        install_drafting_timer(llm)
        settings = engine_settings(llm)
        warm_up = SamplingParams(temperature=0.0, max_tokens=WARM_UP_TOKENS)
        llm.chat(job.chats[: job.batch_size], warm_up, use_tqdm=False)
        runs = {}
        for temperature in job.temperatures:
            llm.reset_prefix_cache()
            params = SamplingParams(
                temperature=temperature,
                max_tokens=job.max_tokens,
                ignore_eos=ignores_eos(job.ignore_eos, temperature),
            )
            runs[temperature] = timed_chat(llm, job.chats, params)
    return runs, settings


def engine_settings(llm: Any) -> dict[str, Any]:
    """Scheduler settings as the engine resolved them (vLLM may override what was asked)."""
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    return {
        "async_scheduling": bool(scheduler.async_scheduling),
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
    }


def _child(function: Callable[[Any], Any], argument: Any, sender: Any) -> None:
    """(In the child.) Send ("ok", result) or ("error", traceback) back to the parent."""
    try:
        sender.send(("ok", function(argument)))
    except Exception:  # noqa: BLE001 - every failure goes back to the parent, with its trace
        sender.send(("error", traceback.format_exc()))
    finally:
        sender.close()


def run_isolated(function: Callable[[Any], Any], argument: Any) -> Any:
    """`function(argument)` in a child forked from the fork server (see `prepare_engine_server`);
    its result, or BenchError with the child's traceback."""
    context = multiprocessing.get_context("forkserver")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(function, argument, sender))
    process.start()
    sender.close()
    try:
        while not receiver.poll(0.5):
            if not process.is_alive() and not receiver.poll(0):
                raise BenchError(f"engine process died (exit code {process.exitcode})")
        status, payload = receiver.recv()
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
            process.join()
        receiver.close()
    if status == "error":
        raise BenchError(f"engine run failed:\n{payload}")
    return payload


def engine_jobs(config: BenchConfig, target: str, chats: list[Chat]) -> list[EngineJob]:
    """Every engine, round by round: per round and engine mode, each batch size's methods
    back to back, each round starting one method later than the one before (why, with an
    example: docs/design/engine-layer.md, "Engines in child processes")."""
    return [
        EngineJob(
            target,
            method,
            batch,
            take_prompts(chats, config.num_prompts(batch)),
            config.temperatures,
            config.max_tokens,
            repeat,
            mode,
            config.dtype,
            config.ignore_eos,
            config.compiled,
        )
        for repeat in range(config.repeats)
        for mode in config.engines
        for batch in config.batch_sizes
        for method in rotated(config.methods, repeat)
    ]


def rotated(methods: Sequence[Method], repeat: int) -> list[Method]:
    """`methods` starting at index `repeat` (mod their number): (a, b, c), 1 -> [b, c, a]."""
    start = repeat % len(methods)
    return [*methods[start:], *methods[:start]]


def run_bench(config: BenchConfig, command: str) -> dict[str, Any]:
    """Run every engine job, writing the results after each; return the final report."""
    from tqdm import tqdm

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.report import build_report, write_json, write_outputs

    chats = load_prompts(config.prompts_file, config.cache_dir)  # before any engine starts
    target = str(fetch_reference_target(config.cache_dir))
    jobs = engine_jobs(config, target, chats)
    prepare_engine_server()
    results: list[tuple[EngineJob, dict[float, Run], dict[str, Any]]] = []
    progress = tqdm(jobs, desc="bench", unit="engine", dynamic_ncols=True)
    for job in progress:
        progress.set_postfix_str(
            f"{job.method.name} batch {job.batch_size} {job.engine_mode} round {job.repeat + 1}"
        )
        load = os.getloadavg()[0]
        runs, settings = run_isolated(run_engine_job, job)
        results.append((job, runs, {**settings, "load_avg_1m_before": load}))
        report = build_report(config, command, len(chats), results)
        write_json(report, config.out)
    progress.close()
    reruns = check_ties(results) if config.tie_check else None
    report = build_report(config, command, len(chats), results, reruns)
    write_outputs(report, config.out)
    return report


def check_ties(results: list[tuple[EngineJob, dict[float, Run], Any]]) -> dict:
    """The tie check: vanilla's untimed reruns of the chats whose T = 0 outputs parted, by
    (engine mode, batch size) and chat index (docs/design/engine-layer.md, "The tie
    check")."""
    reruns = {}
    for job in tie_jobs(results):
        batch, mode = job.timed.batch_size, job.timed.engine_mode
        which = "them" if batch == 1 else f"all {len(job.timed.chats)}, as the batches ran"
        print(
            f"tie check: {len(job.lengths)} prompt(s) parted at batch {batch} "
            f"({mode}); rerunning {which} in a vanilla engine"
        )
        reruns[mode, batch] = run_isolated(run_tie_job, job)
    return reruns


@dataclass(frozen=True)
class TieJob:
    """One vanilla rerun engine: a timed engine of its (engine mode, batch size), whose
    settings it takes (not its method), and the chats to rerun for how many tokens."""

    timed: EngineJob
    lengths: dict[int, int]  # chat index -> tokens up to and including its latest parting


def parted_lengths(results: list[tuple[Any, dict[float, Run], Any]]) -> dict[tuple, dict]:
    """Per (engine mode, batch size), each chat that some T = 0 run parted at, with the
    tokens its rerun needs (the latest first difference + 1). Runs are compared with the
    vanilla run of their round, engine mode and batch size."""
    vanilla = round_vanillas(results)
    groups: dict[tuple[str, int], dict[int, int]] = {}
    for job, runs, _ in results:
        reference = vanilla.get(round_key(job, 0.0))
        if job.method.kind == "vanilla" or 0.0 not in runs or reference is None:
            continue
        for i, (a, b) in enumerate(zip(reference.tokens, runs[0.0].tokens, strict=True)):
            if (first := first_difference(a, b)) is not None:
                lengths = groups.setdefault((job.engine_mode, job.batch_size), {})
                lengths[i] = max(lengths.get(i, 0), first + 1)
    return groups


def tie_jobs(results: list[tuple[EngineJob, dict[float, Run], Any]]) -> list[TieJob]:
    """The rerun engines the timed `results` (EngineJob, runs, settings) call for."""
    timed = {(job.engine_mode, job.batch_size): job for job, _, _ in results}
    return [TieJob(timed[key], lengths) for key, lengths in parted_lengths(results).items()]


def run_tie_job(job: TieJob) -> dict[int, VanillaRerun]:
    """(In a child process.) The reruns of `job`, by chat index: greedy, with the timed
    runs' max_tokens and EOS policy at T = 0 (every chat whole above batch size 1)."""
    timed = job.timed
    set_engine_mode(timed.engine_mode)
    eager = not timed.compiled
    with engine(
        timed.target, None, timed.batch_size, dtype=timed.dtype, enforce_eager=eager
    ) as llm:
        whole = None if timed.batch_size == 1 else timed.max_tokens
        ignore_eos = ignores_eos(timed.ignore_eos, 0.0)
        return rerun_vanilla(llm, timed.chats, job.lengths, whole, ignore_eos)


def prepare_engine_server() -> None:
    """Environment for in-process engines, and vLLM preloaded in the fork server (started
    with the first engine). Quieter vLLM logs unless the user chose a level."""
    from vllm_clover.engine import set_cpu_env_defaults

    set_cpu_env_defaults()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["vllm.entrypoints.llm", "vllm.sampling_params", __name__]
    )


def bench_command(args: Any, argv: Sequence[str]) -> None:
    """`vllm-clover bench ...`: validate everything, run, print where the results are."""
    from vllm_clover.bench.arguments import config_from_args
    from vllm_clover.bench.report import beyond_rounding, busy_warning, markdown_table
    from vllm_clover.bench.ties import rounding_bug

    config = config_from_args(args)
    report = run_bench(config, shlex.join(["vllm-clover", *argv]))
    print("\n" + markdown_table(report["summary"]))
    if warning := busy_warning(report):
        print(f"\n{warning}")
    print(f"\nresults: {Path(config.out).resolve()}/ (results.json, results.md)")
    if bugs := beyond_rounding(report):
        raise BenchError(rounding_bug(config.dtype, bugs))
