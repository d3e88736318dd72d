"""The `vllm-clover bench` command line: its flags, and the `BenchConfig` they make.

Unset workload flags take the full protocol's preset (or --quick's); every value is checked
by `config.py`, before any engine starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `bench` command's flags; unset ones take the full (or --quick) preset."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few-minute smoke run: batch "
        "sizes 1 4, T=0, 8 prompts, 32 tokens, one in-process round (every method still runs)",
    )
    _add_method_arguments(parser)
    _add_workload_arguments(parser)
    parser.add_argument("--out", default="bench-results", help="results folder")
    parser.add_argument(
        "--no-tie-check",
        action="store_true",
        help="skip the tie check: by default, where a T=0 output differs from vanilla's, an "
        "untimed vanilla engine reruns those prompts with logprobs after the timed runs and "
        "the table tells rounding ties (bfloat16) from partings beyond rounding (a bug: the "
        "bench then fails)",
    )
    parser.add_argument("--cache-dir")


def _add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """What is compared: the methods, their checkpoints and Clover's variants."""
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        help=f"among {' '.join(STANDARD_METHODS)} (vanilla always runs)",
    )
    parser.add_argument(
        "--clover",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="an extra Clover checkpoint to compare (e.g. an ablation); repeatable",
    )
    parser.add_argument(
        "--clover-variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='the --clover-heads checkpoint (or the JSON\'s "model") with more '
        "speculative_config keys, run as NAME beside the others; repeatable. E.g. "
        'fixed=\'{"draft_budget": "fixed"}\' (K drafts at every step: the heads\', or '
        '"num_speculative_tokens"), floor=\'{"draft_budget": "fixed", '
        '"num_speculative_tokens_per_batch_size": [[1, 1048576, 0]]}\' (K = 0 at every step: '
        "what speculation costs when it drafts nothing), "
        'greedy=\'{"draft_sample_method": "greedy"}\' (argmax drafts at T > 0), '
        'tree=\'{"speculative_token_tree": "default"}\' (the checkpoint\'s token tree, or one '
        'such as "[(0,), (1,), (0, 0)]", drafted whole)',
    )
    parser.add_argument(
        "--clover-heads",
        default=str(CLOVER2_HEADS),
        help="the Clover checkpoint of the clover method (default: the bundled Clover-2 heads, "
        "as the demo)",
    )
    parser.add_argument("--medusa-heads", default=str(REFERENCE_MEDUSA))
    parser.add_argument(
        "--eagle3-drafter", help="an EAGLE-3 drafter folder (speculators format) for eagle3"
    )
    parser.add_argument("--ngram-tokens", type=int, default=4, help="ngram K")


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What each method is measured on, and how often (unset: the preset's values)."""
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", help="max_num_seqs values (default 1 4 16 64)"
    )
    parser.add_argument("--temperatures", type=float, nargs="+", help="default 0 1")
    parser.add_argument("--max-tokens", type=int, help="new tokens per prompt (default 128)")
    parser.add_argument("--min-prompts", type=int, help="prompts per run at least (default 16)")
    parser.add_argument(
        "--prompts-per-seq",
        type=int,
        help="prompts per run at least this times the batch size (default 2)",
    )
    parser.add_argument(
        "--prompts",
        help='JSONL of {"prompt": ...} records or a ShareGPT file (default: MT-Bench first turns)',
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="rounds of every engine, alternating; figures are medians (default 3)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINE_MODES,
        help="engine modes to measure (default both; multiprocess is what users get)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="the target's dtype: float32 (default; greedy output equals vanilla exactly) or "
        "bfloat16 (what a CPU with AMX serves fastest; equal except at rounding ties)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run the target under vLLM's torch.compile mode, as `vllm serve` and LLM() do by "
        "default (each engine start compiles: about a minute more); default eager, where "
        "engines start fast. The Clover heads run eager either way",
    )
    parser.add_argument(
        "--ignore-eos",
        default="auto",
        choices=EOS_POLICIES,
        help="generate every answer to --max-tokens past its end-of-sequence token: auto "
        "(default) at T > 0 only, where answer lengths are random and would make runs time "
        "different amounts of work; always; never",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """BenchConfig from parsed `bench` flags (BenchError on bad input)."""
    preset = QUICK_PRESET if args.quick else FULL_PRESET
    chosen = {
        key: tuple(value) if isinstance(value, list) else value
        for key in preset
        if (value := getattr(args, key)) is not None
    }
    methods = resolve_methods(
        args.methods,
        args.clover_heads,
        args.medusa_heads,
        args.ngram_tokens,
        args.clover,
        tuple(args.clover_variant),
        args.eagle3_drafter,
    )
    return BenchConfig(
        methods=methods,
        **{**preset, **chosen},
        prompts_file=args.prompts,
        dtype=args.dtype,
        compiled=args.compiled,
        ignore_eos=args.ignore_eos,
        tie_check=not args.no_tie_check,
        out=Path(args.out),
        cache_dir=args.cache_dir,
        quick=args.quick,
    )
