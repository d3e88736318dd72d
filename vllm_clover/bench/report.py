"""Benchmark figures: one row per timed run, their medians per configuration, JSON and
Markdown. Every ratio is to vanilla at the same batch size, temperature, engine mode and
round, in the same invocation (docs/design/engine-layer.md, "Medians")."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_clover.bench.config import BenchConfig
from vllm_clover.bench.measure import Run, identical_outputs
from vllm_clover.bench.summary import summarize
from vllm_clover.bench.ties import Parting, VanillaRerun, parting

# Environment variables that change vLLM's speed on CPU, recorded with the results.
SPEED_ENV = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    "LD_PRELOAD",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
)
DEFINITIONS = {
    "tokens_per_second": "output tokens of all prompts / wall seconds of the timed "
    "LLM.chat call (prefill, scheduling and detokenization included)",
    "ratio_to_vanilla": "tokens_per_second / vanilla tokens_per_second, same batch size, "
    "temperature, prompts and invocation",
    "tau": "1 + accepted draft tokens / drafts (mean tokens per request per verification "
    "step, the bonus token included)",
    "acceptance_rates": "per draft position i: drafts whose first i+1 tokens were accepted "
    "/ drafts",
    "steps": "engine steps: count of vLLM's vllm:iteration_tokens_total histogram",
    "drafting_overhead": "seconds inside vLLM's propose_draft_token_ids (the whole drafting "
    "of a step: Clover's Augmenting Block + K head steps, Medusa's heads, "
    "ngram's lookup) per engine step / vanilla seconds per engine step",
    "drafting_share": "seconds inside propose_draft_token_ids / wall seconds of the run",
    "step_time_ratio": "(seconds / steps) / vanilla (seconds / steps): the full price of a "
    "speculative step (drafting + verifying K+1 tokens per request + "
    "rejection sampling) relative to a plain step",
    "equal_to_vanilla": "T=0 only: prompts whose token ids equal vanilla's / prompts",
    "lookup_verified": 'Clover with "lookup": draft tokens of the prompt lookup\'s chains that '
    "vLLM verified (the rest of draft_tokens are the heads'); lookup_accepted: those accepted; "
    "lookup_only_steps: steps where every request drafted from the lookup (no head loop ran)",
    "partings": "T=0 only, after the tie check: each prompt whose tokens differ from its "
    "round's vanilla, the first differing token, and vanilla's top-2 logprob gap there "
    "from an untimed vanilla rerun (null: the rerun did not reproduce vanilla's tokens)",
    "tie_prompts": "partings at a rounding tie: gap <= 1e-4 in float32, 0.5 in bfloat16",
    "beyond_rounding": "partings where vanilla's best token led by more than rounding: a "
    "bug (the bench then fails after writing its results)",
    "summary": "per (method, engine mode, batch size, temperature): the median over rounds "
    "of tokens_per_second, ratio_to_vanilla, tau and the overheads, with [min, max] "
    "ranges; acceptance pooled over rounds; equal_prompts and partings counts summed",
}


def run_row(
    job: Any,
    temperature: float,
    run: Run,
    vanilla: Run,
    engine: dict[str, Any],
    reruns: dict[int, VanillaRerun] | None = None,
) -> dict[str, Any]:
    """All figures of one timed run of EngineJob `job`, with its ratios to `vanilla`; at
    T = 0, once the tie check has run, the partings with vanilla's `reruns` (by chat)."""
    method, counters = job.method, run.counters
    is_spec = method.kind != "vanilla"
    row = {
        "method": method.name,
        "kind": method.kind,
        "batch_size": job.batch_size,
        "temperature": temperature,
        "repeat": job.repeat,
        "engine_mode": job.engine_mode,
        "speculative_config": method.speculative_config(),
        "num_prompts": len(run.tokens),
        "output_tokens": run.output_tokens,
        "seconds": run.seconds,
        "tokens_per_second": run.tokens_per_second,
        "ratio_to_vanilla": run.tokens_per_second / vanilla.tokens_per_second,
        **asdict(counters),
        "tau": counters.tau if is_spec else None,
        "acceptance_rates": counters.acceptance_rates,
        "seconds_per_step": run.seconds_per_step,
        "engine": engine,
    }
    row.update(_overheads(run, vanilla) if is_spec else {})
    if temperature == 0 and is_spec:
        row["equal_prompts"] = identical_outputs(vanilla.tokens, run.tokens)
        row["equal_to_vanilla"] = row["equal_prompts"] / len(run.tokens)
        if reruns is not None:
            row.update(partings_figures(job.dtype, vanilla, run, reruns))
    return row


def partings_figures(
    dtype: str, vanilla: Run, run: Run, reruns: dict[int, VanillaRerun]
) -> dict[str, Any]:
    """partings, tie_prompts, unknown_partings and beyond_rounding (see DEFINITIONS)."""
    partings = [
        parting(i, a, b, reruns.get(i))
        for i, (a, b) in enumerate(zip(vanilla.tokens, run.tokens, strict=True))
        if a != b
    ]
    return {
        "partings": [asdict(p) for p in partings],
        "tie_prompts": sum(p.is_tie(dtype) for p in partings),
        "unknown_partings": sum(p.gap is None for p in partings),
        "beyond_rounding": sum(p.is_bug(dtype) for p in partings),
    }


def beyond_rounding(report: dict[str, Any]) -> str | None:
    """The runs' partings beyond rounding, in words (None if there are none)."""
    bugs = [
        f"{row['method']} at batch {row['batch_size']} ({row['engine_mode']}, round "
        f"{row['repeat'] + 1}): prompt {p['prompt']} at token {p['token']}, gap {p['gap']:.3g}"
        for row in report["runs"]
        if row.get("beyond_rounding")
        for p in row["partings"]
        if Parting(**p).is_bug(report["config"]["dtype"])
    ]
    return "; ".join(bugs) or None


def _overheads(run: Run, vanilla: Run) -> dict[str, float | None]:
    """drafting_overhead, drafting_share, step_time_ratio (see DEFINITIONS)."""
    counters, step, vanilla_step = run.counters, run.seconds_per_step, vanilla.seconds_per_step
    if not (step and vanilla_step):
        return {"drafting_overhead": None, "drafting_share": None, "step_time_ratio": None}
    return {
        "drafting_overhead": counters.drafting_seconds / counters.steps / vanilla_step,
        "drafting_share": counters.drafting_seconds / run.seconds,
        "step_time_ratio": step / vanilla_step,
    }


def round_key(job: Any, temperature: float) -> tuple:
    """What pairs a run with its vanilla: (round, engine mode, batch size, temperature)."""
    return (job.repeat, job.engine_mode, job.batch_size, temperature)


def round_vanillas(results: list[tuple[Any, dict[float, Run], Any]]) -> dict[tuple, Run]:
    """The vanilla runs among (EngineJob, runs by temperature, settings) `results`, by
    `round_key`."""
    return {
        round_key(job, temperature): run
        for job, runs, _ in results
        if job.method.kind == "vanilla"
        for temperature, run in runs.items()
    }


def build_rows(
    results: list[tuple[Any, dict[float, Run], dict[str, Any]]], reruns: dict | None = None
) -> list[dict[str, Any]]:
    """Rows for (EngineJob, runs by temperature, engine settings) results, each compared
    with its round's vanilla run (none yet, mid-round: no row yet). `reruns`: the tie
    check's, by (engine mode, batch size), once it has run."""
    vanilla = round_vanillas(results)
    return [
        run_row(
            job,
            temperature,
            run,
            vanilla[round_key(job, temperature)],
            engine,
            None if reruns is None else reruns.get((job.engine_mode, job.batch_size), {}),
        )
        for job, runs, engine in results
        for temperature, run in runs.items()
        if round_key(job, temperature) in vanilla
    ]


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, Python, vLLM and the git commit of this checkout."""
    from vllm_clover.compat import installed_vllm

    cpu = _first_field(Path("/proc/cpuinfo"), "model name") or platform.processor()
    memory = _first_field(Path("/proc/meminfo"), "MemTotal")
    repo = Path(__file__).resolve().parents[2]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "vllm": "==".join(installed_vllm() or ("?",)),
        "git_commit": _git(repo, "rev-parse", "HEAD"),
        "git_dirty": bool(_git(repo, "status", "--porcelain", "--untracked-files=no")),
        "env": {name: os.environ.get(name) for name in SPEED_ENV},
    }


def _first_field(path: Path, key: str) -> str | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)


def _git(repo: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def build_report(
    config: BenchConfig,
    command: str,
    available_prompts: int,
    results: list[tuple[Any, dict[float, Run], dict[str, Any]]],
    reruns: dict | None = None,
) -> dict[str, Any]:
    """The whole JSON document: command, machine, configuration, definitions, rows (with
    partings where the tie check's `reruns` are given: `build_rows`)."""
    settings = asdict(config)
    settings["out"] = str(config.out)
    settings["available_prompts"] = available_prompts
    settings["prompts_repeated"] = any(
        config.num_prompts(b) > available_prompts for b in config.batch_sizes
    )
    return {
        "command": command,
        "machine": machine_info(),
        "config": settings,
        "definitions": DEFINITIONS,
        "summary": summarize(rows := build_rows(results, reruns)),
        "runs": rows,
    }


def write_json(report: dict[str, Any], out: Path) -> Path:
    """`out`/results.json (rewritten after every engine, so a failed run keeps the rest)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def markdown_table(summary: list[dict[str, Any]]) -> str:
    """One line per configuration (``summarize`` rows): medians with their [min-max] range,
    tau, drafts verified per drafting step, acceptance, overheads, T=0 equality, and the
    prompt lookup's share of the drafts where a run used "lookup"."""
    lookup = any(row.get("lookup_verified") for row in summary)
    lines = [
        "| method | engine | batch | T | tokens/s | vs vanilla | tau | drafts verified "
        "| acceptance per position | drafting overhead | step time vs vanilla "
        "| T=0 equal to vanilla |" + (" lookup drafts (accepted) |" if lookup else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|" + ("---:|" if lookup else ""),
    ]
    for row in summary:
        rates = " ".join(f"{rate:.2f}" for rate in row["acceptance_rates"]) or "-"
        equal = "reference" if row["kind"] == "vanilla" else _equality(row)
        verified = row["draft_tokens"] / row["drafts"] if row["drafts"] else None
        lines.append(
            f"| {row['method']} | {row['engine_mode']} | {row['batch_size']} | "
            f"{row['temperature']:g} | {_spread(row, 'tokens_per_second', '.1f')} | "
            f"{_spread(row, 'ratio_to_vanilla', '.2f', 'x')} | {_fmt(row['tau'], '.2f')} | "
            f"{_fmt(verified, '.2f')} | {rates} | {_fmt(row.get('drafting_overhead'), '.0%')} | "
            f"{_fmt(row.get('step_time_ratio'), '.2f')} | {equal} |"
            + (f" {_lookup(row)} |" if lookup else "")
        )
    return "\n".join(lines)


def _lookup(row: dict[str, Any]) -> str:
    """'31% (64%)': the prompt lookup's share of the verified drafts, and how many of its
    own were accepted; '-' for a method without "lookup"."""
    verified = row.get("lookup_verified", 0)
    if not verified or not row["draft_tokens"]:
        return "-"
    share = verified / row["draft_tokens"]
    return f"{share:.0%} ({row.get('lookup_accepted', 0) / verified:.0%})"


def _equality(row: dict[str, Any]) -> str:
    """'22/24, 2 ties': equal prompts and, after the tie check, what the others were."""
    if "equal_prompts" not in row:
        return "n/a"
    text = f"{row['equal_prompts']}/{row['num_prompts']}"
    ties = row.get("tie_prompts")
    counts = (
        (ties, "tie" if ties == 1 else "ties"),
        (row.get("unknown_partings"), "unknown"),
        (row.get("beyond_rounding"), "BEYOND ROUNDING"),
    )
    return ", ".join([text, *(f"{n} {what}" for n, what in counts if n)])


def _spread(row: dict[str, Any], name: str, pattern: str, unit: str = "") -> str:
    """'1.05x (1.00-1.07)': the median and, over several rounds, its range."""
    text = f"{row[name]:{pattern}}{unit}"
    low, high = row[f"{name}_range"]
    return text if row["rounds"] == 1 else f"{text} ({low:{pattern}}-{high:{pattern}})"


def busy_warning(report: dict[str, Any]) -> str | None:
    """A warning if the machine was busy with other work during the benchmark (a 1-minute
    load average above cores + 1 before some engine), else None."""
    cores = report["machine"]["usable_cores"] or 1
    loads = [row["engine"].get("load_avg_1m_before", 0.0) for row in report["runs"]]
    if not loads or max(loads) <= cores + 1:
        return None
    return (
        f"Warning: the machine was busy (1-minute load average up to {max(loads):.1f} on "
        f"{cores} cores before an engine started): timings and ratios are unreliable."
    )


def markdown_document(report: dict[str, Any]) -> str:
    """results.md: the command, the machine, the table and what each column means."""
    machine, config = report["machine"], report["config"]
    prompts = config["prompts_file"] or "MT-Bench first turns (chat template)"
    lines = [
        "# vllm-clover bench",
        "",
        f"    {report['command']}",
        "",
        f"Machine: {machine['cpu']}, {machine['usable_cores']} usable cores, "
        f"{machine['memory']}; vLLM {machine['vllm']}; git {machine['git_commit']}"
        f"{' (uncommitted changes)' if machine['git_dirty'] else ''}.",
        "",
        f"Prompts: {prompts}, {config['max_tokens']} new tokens each, at least "
        f"{config['min_prompts']} and {config['prompts_per_seq']}x the batch size per run"
        f"{' (cycled: fewer prompts available)' if config['prompts_repeated'] else ''}; "
        f"{_eos_text(config.get('ignore_eos', 'never'))}; "
        f"{config.get('dtype', 'float32')}, "
        f"{'compiled' if config.get('compiled') else 'eager'}; "
        f"{config['repeats']} alternating round(s) "
        "of every engine (each round starting one method later), engine "
        f"mode(s) {', '.join(config['engines'])}; batch size = max_num_seqs.",
        "",
        *([warning, ""] if (warning := busy_warning(report)) else []),
        markdown_table(report["summary"]),
        "",
        "## Definitions",
        "",
    ]
    lines += [f"- **{name}**: {text}" for name, text in report["definitions"].items()]
    return "\n".join(lines) + "\n"


def _eos_text(policy: str) -> str:
    """How answers ended, in words (--ignore-eos)."""
    return {
        "auto": "answers stop at EOS at T = 0 and run to the token limit at T > 0",
        "always": "answers run to the token limit past EOS",
        "never": "answers stop at EOS",
    }[policy]


def write_outputs(report: dict[str, Any], out: Path) -> list[Path]:
    """results.json and results.md in `out`; their paths."""
    written = [write_json(report, out), out / "results.md"]
    written[1].write_text(markdown_document(report))
    return written
