"""The `vllm-clover` command.

vllm-clover fetch {smollm2-135m-instruct,sharegpt,mt-bench,all} [--cache-dir DIR] [--force]
vllm-clover serve MODEL [any `vllm serve` argument ...]
vllm-clover demo [--num-prompts N] [--max-tokens N]
vllm-clover bench [--quick] [--out DIR] [--clover NAME=DIR ...] [options]
vllm-clover train --target DIR_OR_ID --out DIR [--data FILE] [options]   (also under torchrun)
vllm-clover generate-data --target DIR_OR_ID --out FILE.jsonl [--data FILE] [options]
vllm-clover eval-heads --target DIR_OR_ID --heads DIR [DIR ...] [--data FILE] [options]
vllm-clover make-heads --target DIR_OR_ID --out DIR [options]   (all of the three, checked)
vllm-clover search-tree --heads DIR --prompts FILE [--write-default N] [options]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.assets.wheels import AssetError
from vllm_clover.bench.arguments import add_arguments as add_bench_arguments
from vllm_clover.bench.config import BenchError
from vllm_clover.bench.tree_search import TreeSearchConfig
from vllm_clover.eagle3.config import Eagle3TrainConfig
from vllm_clover.make_heads import MakeHeadsConfig
from vllm_clover.training.config import (
    EvalConfig,
    GenerateConfig,
    TrainConfig,
    TrainingError,
)
from vllm_clover.training.flags import add_arguments, from_args

FETCHERS: dict[str, Callable[..., Path]] = {
    REFERENCE_TARGET: fetch_reference_target,
    "sharegpt": fetch_sharegpt,
    "mt-bench": fetch_mtbench,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-clover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch", help="download, verify and cache offline assets")
    fetch.add_argument("assets", nargs="+", choices=[*FETCHERS, "all"])
    fetch.add_argument(
        "--cache-dir", help="cache root (default: $CLOVER_CACHE_DIR or ~/.cache/vllm-clover)"
    )
    fetch.add_argument("--force", action="store_true", help="rebuild even if cached")

    # Parsed by vLLM itself (see main); listed here for --help only.
    commands.add_parser(
        "serve",
        help="start vLLM's OpenAI-compatible server "
        "(all `vllm serve` arguments; try `vllm-clover serve --help`)",
        add_help=False,
    )

    demo = commands.add_parser(
        "demo",
        help="Clover vs vanilla on MT-Bench with the reference "
        "target: output equality, acceptance, speedup",
    )
    demo.add_argument("--num-prompts", type=int, default=8, help="MT-Bench first turns (8)")
    demo.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (128)")
    demo.add_argument("--batch-size", type=int, default=1, help="vLLM max_num_seqs (1)")
    demo.add_argument("--heads", help="Clover checkpoint (default: the bundled Clover-2 heads)")
    demo.add_argument("--cache-dir", help="asset cache (default: $CLOVER_CACHE_DIR or ~/.cache)")
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's own output here (default: in <cache>/logs/demo.log)",
    )
    demo.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="target dtype (default auto: the target's own, bfloat16; float32: token-exact)",
    )
    make = commands.add_parser(
        "make-heads",
        help="one command from a target to served heads: self-distil, train, evaluate, "
        "check through vLLM (resumable)",
    )
    add_arguments(make, MakeHeadsConfig)
    bench = commands.add_parser(
        "bench",
        help="vanilla, ngram, Medusa and Clover through vLLM "
        "on the same prompts: throughput, tau, acceptance, equality",
    )
    add_bench_arguments(bench)
    search = commands.add_parser(
        "search-tree",
        help="measure a wide token tree's node acceptance through vLLM; the best subtree of "
        "each size, optionally written as the heads' default tree",
    )
    add_arguments(search, TreeSearchConfig)
    add_training_commands(commands)

    add_export_medusa_command(commands)
    return parser


def add_export_medusa_command(commands: argparse._SubParsersAction) -> None:
    """`export-medusa`: training/medusa_export.py."""
    export = commands.add_parser(
        "export-medusa",
        help="write Medusa-configured heads (train --medusa) in vLLM's native Medusa format",
    )
    export.add_argument("--heads", required=True, help="checkpoint written by train --medusa")
    export.add_argument("--target", required=True, help="the target they were trained for")
    export.add_argument("--out", required=True)
    export.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("float32", "bfloat16"),
        help="dtype of the written weights (vLLM casts to the serving dtype)",
    )
    export.add_argument("--overwrite", action="store_true")


def add_training_commands(commands: argparse._SubParsersAction) -> None:
    """`train`, `generate-data`, `eval-heads`, `train-eagle3`: one flag per config field."""
    helps = {
        "train": (TrainConfig, "distil Clover (or --medusa) heads from a frozen target"),
        "generate-data": (GenerateConfig, "regenerate assistant turns with the target"),
        "eval-heads": (EvalConfig, "offline head accuracy and chain acceptance"),
        "train-eagle3": (Eagle3TrainConfig, "an EAGLE-3 drafter, speculators format"),
    }
    for name, (cls, text) in helps.items():
        add_arguments(commands.add_parser(name, help=text, description=text), cls)


def run_training_command(args: argparse.Namespace) -> None:
    if args.command == "train":
        from vllm_clover.training.trainer import train

        print(train(from_args(args, TrainConfig)).summary())
    elif args.command == "generate-data":
        from vllm_clover.training.generate_data import generate_data

        generate_data(from_args(args, GenerateConfig))
    elif args.command == "eval-heads":
        from vllm_clover.training.evaluate import eval_heads

        eval_heads(from_args(args, EvalConfig))
    elif args.command == "train-eagle3":
        from vllm_clover.eagle3.train import summary, train_eagle3

        print(summary(train_eagle3(from_args(args, Eagle3TrainConfig)), args.out))


def fetch(assets: Sequence[str], cache_dir: str | None, force: bool) -> None:
    names = list(FETCHERS) if "all" in assets else list(dict.fromkeys(assets))
    for name in names:
        print(f"{name}: {FETCHERS[name](cache_dir, force=force)}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # vLLM parses the rest: every `vllm serve` flag works
        from vllm_clover.serve import serve

        serve(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(args.assets, args.cache_dir, args.force)
        elif args.command == "export-medusa":
            from vllm_clover.training.medusa_export import export_medusa_command

            out = export_medusa_command(
                args.heads, args.target, args.out, args.overwrite, args.dtype
            )
            print(f"wrote vLLM Medusa heads to {out}")
        elif args.command == "demo":
            from vllm_clover.demo import run_demo

            run_demo(
                args.num_prompts,
                args.max_tokens,
                args.cache_dir,
                args.heads,
                args.batch_size,
                args.verbose,
                args.dtype,
            )
        elif args.command == "make-heads":
            from vllm_clover.make_heads import make_heads

            make_heads(from_args(args, MakeHeadsConfig))
        elif args.command == "bench":
            from vllm_clover.bench.runner import bench_command

            bench_command(args, argv)
        elif args.command == "search-tree":
            from vllm_clover.bench.tree_search import search_tree

            search_tree(from_args(args, TreeSearchConfig))
        else:
            run_training_command(args)
    except TrainingError as err:
        print(f"vllm-clover {args.command}: error: {err}", file=sys.stderr)
        return 2
    except AssetError as err:
        print(f"vllm-clover: error: {err}", file=sys.stderr)
        return 2
    except BenchError as err:
        print(f"vllm-clover {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
