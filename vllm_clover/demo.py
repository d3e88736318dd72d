"""`vllm-clover demo`: the same MT-Bench answers through vLLM, plainly and with Clover, on the
bundled reference target: output equality (a bfloat16 parting must be a rounding tie,
``bench/ties.py``), tau and the speedup (docs/design/engine-layer.md, "The commands")."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from vllm_clover.assets.cache import CACHE_HELP, cache_root
from vllm_clover.assets.data import fetch_mtbench, mtbench_questions
from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.config import BenchError
from vllm_clover.bench.measure import Run, engine, identical_outputs, timed_chat
from vllm_clover.bench.ties import NEAR_TIE, Parting, rounding_bug, vanilla_partings
from vllm_clover.bundled import CLOVER2_HEADS
from vllm_clover.console import quiet_output
from vllm_clover.cpu.isa import cpu_flags, cpu_model, isa_family
from vllm_clover.training.flags import opt

TIE_NOTE = (
    "verification scores several tokens at once, where rounding may swap two near-equal "
    "tokens, docs/equivalence.md; --dtype float32 is token-exact"
)
# "in one sentence": the bare question is a bfloat16 rounding tie for this target
# (docs/design/engine-layer.md, "The commands").
SANITY_QUESTION = "What is the capital of France? Answer in one sentence."
SANITY_ANSWER = "Paris"


def generate(
    target: Path, chats: list, max_tokens: int, batch_size: int, spec=None, dtype: str = "auto"
) -> Run:
    """Start an engine, generate greedily for `chats`, tear the engine down."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    with engine(target, spec, batch_size, dtype=dtype) as llm:
        llm.chat(
            chats[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False
        )  # warm-up
        run = timed_chat(llm, chats, greedy)
        sanity = llm.chat([{"role": "user", "content": SANITY_QUESTION}], greedy, use_tqdm=False)
    if SANITY_ANSWER not in sanity[0].outputs[0].text:
        raise SystemExit(f"sanity check failed: {sanity[0].outputs[0].text!r}")
    return run


def report(
    vanilla: Run,
    clover: Run,
    num_heads: int,
    dtype: str,
    partings: list[Parting],
    out: TextIO | None = None,
) -> None:
    """Print the speeds, tau, per-position acceptance and output equality (where and why
    outputs part); then SystemExit if an output parted from vanilla's anywhere but at a
    rounding tie."""
    out = out or sys.stdout
    speedup = clover.tokens_per_second / vanilla.tokens_per_second
    print(f"  vanilla {vanilla.tokens_per_second:6.1f} tokens/s", file=out)
    print(f"  clover  {clover.tokens_per_second:6.1f} tokens/s  {speedup:.2f}x vanilla", file=out)
    counters = clover.counters
    if counters.drafts:
        per_step = counters.draft_tokens / counters.drafts
        rates = " ".join(f"{rate:.2f}" for rate in counters.acceptance_rates)
        print(
            f"  tau {counters.tau:.2f} tokens per verification step (1 + accepted/drafts); "
            f"{per_step:.1f} drafts per step of at most {num_heads}, accepted per position: "
            f"{rates}",
            file=out,
        )
    else:
        print("  the draft budget chose not to draft in this run (tau: none)", file=out)
    same = identical_outputs(vanilla.tokens, clover.tokens)
    print(f"  outputs: {_equality(same, len(vanilla.tokens), partings, dtype)}", file=out)
    for p in partings:
        where = f"    prompt {p.prompt} parts at token {p.token}"
        if p.gap is None:
            print(f"{where}: vanilla's gap there is unknown (its rerun differed)", file=out)
        elif p.is_bug(dtype):
            print(f"{where}, top-2 gap {p.gap:.3g}: NOT a tie", file=out)
    bugs = [p for p in partings if p.is_bug(dtype)]
    if bugs:
        where = "; ".join(f"prompt {p.prompt} parts from vanilla at token {p.token}" for p in bugs)
        raise SystemExit(f"vllm-clover demo: {rounding_bug(dtype, where)}")


def _equality(same: int, total: int, partings: list[Parting], dtype: str) -> str:
    """How many outputs are token-identical, and where the others part: at a rounding tie
    (with vanilla's top-2 logit gaps there) or not."""
    line = f"{same}/{total} token-identical to vanilla"
    ties = [p for p in partings if p.is_tie(dtype)]
    if ties:
        gaps = ", ".join(f"{p.gap:.3g}" for p in ties)
        line += (
            f"; {len(ties)} part where vanilla's two best tokens were a {dtype} rounding tie "
            f"(top-2 logit gap {gaps}; a tie is <= {NEAR_TIE[dtype]}: {TIE_NOTE})"
        )
    others = len(partings) - len(ties)
    return line + (f"; {others} part elsewhere (below)" if others else "")


@dataclass(frozen=True)
class DemoConfig:
    """The command's flags (one per field, ``training/flags.py``)."""

    num_prompts: int = opt(8, "MT-Bench first turns")
    max_tokens: int = opt(128, "new tokens per prompt")
    batch_size: int = opt(1, "vLLM max_num_seqs")
    heads: str | None = opt(None, "Clover checkpoint (default: the bundled Clover-2 heads)")
    cache_dir: str | None = opt(None, CACHE_HELP)
    verbose: bool = opt(False, "show vLLM's own output here (default: in <cache>/logs/demo.log)")
    dtype: str = opt(
        "auto",
        "target dtype (auto: the target's own, bfloat16; float32: token-exact)",
        choices=("auto", "float32", "bfloat16"),
    )

    def __post_init__(self) -> None:
        if min(self.num_prompts, self.max_tokens, self.batch_size) < 1:
            raise BenchError("--num-prompts, --max-tokens and --batch-size must be >= 1")


def run_demo(cfg: DemoConfig) -> None:
    """The main job, in the target's own dtype unless `dtype` says otherwise, with Clover's
    defaults (what `vllm-clover serve` and `LLM(...)` do without flags). Only the result
    reaches the terminal: vLLM's own output goes to a log file unless `verbose`; a --heads
    folder that is not a Clover checkpoint is an error before any engine starts."""
    heads_dir = Path(cfg.heads) if cfg.heads else CLOVER2_HEADS  # the best bundled heads
    has_heads = cfg.heads or (heads_dir / "config.json").is_file()
    num_heads = _num_heads(heads_dir) if has_heads else 0
    log = None if cfg.verbose else cache_root(cfg.cache_dir) / "logs" / "demo.log"
    with quiet_output(log) as out:
        _demo(out, cfg, heads_dir, num_heads)
        if log is not None:
            print(f"vLLM's own output: {log} (--verbose shows it here)", file=out)


def _demo(out: TextIO, cfg: DemoConfig, heads_dir: Path, num_heads: int) -> None:
    target = fetch_reference_target(cfg.cache_dir)
    questions = mtbench_questions(fetch_mtbench(cfg.cache_dir))[: cfg.num_prompts]
    chats = [[{"role": "user", "content": q.turns[0]}] for q in questions]
    dtype, batch_size, max_tokens = cfg.dtype, cfg.batch_size, cfg.max_tokens
    shown = "bfloat16, the target's own" if dtype == "auto" else dtype
    print(
        f"Clover demo: SmolLM2-135M-Instruct ({shown}) on {cpu_model()} "
        f"({isa_family(cpu_flags())}), {len(chats)} MT-Bench prompts x {max_tokens} tokens, "
        f"batch size {batch_size}, greedy",
        file=out,
    )
    vanilla = generate(target, chats, max_tokens, batch_size, dtype=dtype)
    if not num_heads:
        print(
            f"  no Clover heads at {heads_dir} (not a source checkout? pass --heads DIR): "
            f"vanilla only, {vanilla.tokens_per_second:.1f} tokens/s",
            file=out,
        )
        return
    spec = {"method": "clover", "model": str(heads_dir), "num_speculative_tokens": num_heads}
    clover = generate(target, chats, max_tokens, batch_size, spec, dtype)
    partings = []
    if clover.tokens != vanilla.tokens:  # where and why: one more, untimed vanilla engine
        with engine(target, None, batch_size, dtype=dtype) as llm:
            rerun_all = max_tokens if batch_size > 1 else None  # as the batches ran: see ties
            partings = vanilla_partings(llm, chats, vanilla.tokens, clover.tokens, rerun_all)
    precision = "float32" if dtype == "float32" else "bfloat16"
    report(vanilla, clover, num_heads, precision, partings, out)
    print(f"  {_drafting(dtype)}", file=out)
    print(f"  sanity: {SANITY_QUESTION!r} -> contains {SANITY_ANSWER!r} (both engines)", file=out)


def _drafting(dtype: str) -> str:
    """What multiplies on this CPU, as the engine chose it (its start-up line, in the log)."""
    import torch

    from vllm_clover.cpu.gemm import bf16_products, packed_dtypes
    from vllm_clover.modeling.tables import draft_dtype_setting, scoring_dtype_for

    target = torch.float32 if dtype == "float32" else torch.bfloat16
    rows = scoring_dtype_for(draft_dtype_setting(), target, "cpu", packed_dtypes())
    products = f"; bf16 products on {bf16_products()}" if target == torch.bfloat16 else ""
    return f"drafting: draft rows in {str(rows).removeprefix('torch.')}{products}"


def _num_heads(heads_dir: Path) -> int:
    """The trained heads of a Clover checkpoint; SystemExit naming the problem otherwise."""
    from vllm_clover.modeling.checkpoint import CloverCheckpointError, load_clover_config

    try:
        return load_clover_config(heads_dir).num_heads
    except CloverCheckpointError as err:
        raise SystemExit(f"vllm-clover demo: error: --heads {heads_dir}: {err}") from None
