"""The `vllm-clover bench` command line: its flags, and the `BenchConfig` they make (unset
workload flags take the preset; `config.py` checks every value)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

from vllm_clover.assets.cache import CACHE_HELP
from vllm_clover.bench.config import (
    DEFAULT_METHODS,
    DTYPES,
    ENGINE_MODES,
    EOS_POLICIES,
    FULL_PRESET,
    QUICK_PRESET,
    STANDARD_METHODS,
    BenchConfig,
    resolve_methods,
)
from vllm_clover.bundled import CLOVER2_HEADS, REFERENCE_MEDUSA
from vllm_clover.training.flags import from_args, opt


@dataclass(frozen=True)
class BenchFlags:
    """The command's flags (one per field, ``training/flags.py``)."""

    quick: bool = opt(
        False,
        "a few-minute smoke run: batch sizes 1 4, T=0, 8 prompts, 32 tokens, one in-process "
        "round (every method still runs)",
    )
    # What is compared: the methods, their checkpoints and Clover's variants
    methods: list[str] | None = opt(
        None,
        f"among {' '.join(STANDARD_METHODS)} (vanilla always runs; default: "
        f"{' '.join(DEFAULT_METHODS)})",
        nargs="+",
    )
    clover: list[str] | None = opt(
        None,
        "an extra Clover checkpoint to compare (e.g. an ablation); repeatable",
        action="append",
        metavar="NAME=DIR",
    )
    clover_variant: list[str] | None = opt(
        None,
        'the --clover-heads checkpoint (or the JSON\'s "model") with more '
        "speculative_config keys, run as NAME beside the others; repeatable. E.g. "
        'fixed=\'{"draft_budget": "fixed"}\' (K drafts at every step: the heads\', or '
        '"num_speculative_tokens"), floor=\'{"draft_budget": "fixed", '
        '"num_speculative_tokens_per_batch_size": [[1, 1048576, 0]]}\' (K = 0 at every step: '
        "what speculation costs when it drafts nothing), "
        'greedy=\'{"draft_sample_method": "greedy"}\' (argmax drafts at T > 0), '
        'tree=\'{"speculative_token_tree": "default"}\' (the checkpoint\'s token tree, or one '
        'such as "[(0,), (1,), (0, 0)]", drafted whole)',
        action="append",
        metavar="NAME=JSON",
    )
    clover_heads: str | None = opt(
        None,
        "the Clover checkpoint of the clover method (default: the bundled Clover-2 heads, "
        "as the demo)",
    )
    medusa_heads: str | None = opt(None, "the medusa method's heads (default: the bundled ones)")
    eagle3_drafter: str | None = opt(
        None, "an EAGLE-3 drafter folder (speculators format) for eagle3"
    )
    ngram_tokens: int = opt(4, "ngram K")
    # What each method is measured on, and how often (None: the preset's values)
    batch_sizes: list[int] | None = opt(None, "max_num_seqs values (default 1 4 16 64)", nargs="+")
    temperatures: list[float] | None = opt(None, "default 0 1", nargs="+")
    max_tokens: int | None = opt(None, "new tokens per prompt (default 128)")
    min_prompts: int | None = opt(None, "prompts per run at least (default 16)")
    prompts_per_seq: int | None = opt(
        None, "prompts per run at least this times the batch size (default 2)"
    )
    prompts: str | None = opt(
        None,
        'JSONL of {"prompt": ...} records or a ShareGPT file (default: MT-Bench first turns)',
    )
    repeats: int | None = opt(
        None, "rounds of every engine, alternating; figures are medians (default 3)"
    )
    engines: list[str] | None = opt(
        None,
        "engine modes to measure (default both; multiprocess is what users get)",
        nargs="+",
        choices=ENGINE_MODES,
    )
    dtype: str = opt(
        "float32",
        "the target's dtype: float32 (greedy output equals vanilla exactly) or bfloat16 "
        "(what a CPU with AMX serves fastest; equal except at rounding ties)",
        choices=DTYPES,
    )
    compiled: bool = opt(
        False,
        "run the target under vLLM's torch.compile mode, as `vllm serve` and LLM() do by "
        "default (each engine start compiles: about a minute more); default eager, where "
        "engines start fast. The Clover heads run eager either way",
    )
    ignore_eos: str = opt(
        "auto",
        "generate every answer to --max-tokens past its end-of-sequence token: auto at T > 0 "
        "only, where answer lengths are random and would make runs time different amounts "
        "of work; always; never",
        choices=EOS_POLICIES,
    )
    out: str = opt("bench-results", "results folder")
    tie_check: bool = opt(
        True,
        "the tie check: by default, where a T=0 output differs from vanilla's, an untimed "
        "vanilla engine reruns those prompts with logprobs after the timed runs and the "
        "table tells rounding ties (bfloat16) from partings beyond rounding (a bug: the "
        "bench then fails)",
    )
    cache_dir: str | None = opt(None, CACHE_HELP)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """BenchConfig from parsed `bench` flags (BenchError on bad input)."""
    flags: BenchFlags = from_args(args, BenchFlags)
    methods = resolve_methods(
        flags.methods or list(DEFAULT_METHODS),
        flags.clover_heads or str(CLOVER2_HEADS),
        flags.medusa_heads or str(REFERENCE_MEDUSA),
        flags.ngram_tokens,
        flags.clover or [],
        tuple(flags.clover_variant or ()),
        flags.eagle3_drafter,
    )
    same = {f.name for f in fields(BenchConfig)} - {"methods", "out"}  # flags of the same name
    chosen = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in vars(flags).items()
        if key in same and value is not None
    }
    preset = QUICK_PRESET if flags.quick else FULL_PRESET
    return BenchConfig(
        methods, **{**preset, **chosen}, prompts_file=flags.prompts, out=Path(flags.out)
    )
