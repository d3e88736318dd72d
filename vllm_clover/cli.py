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
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.assets.wheels import AssetError
from vllm_clover.bench.arguments import BenchFlags
from vllm_clover.bench.config import BenchError
from vllm_clover.bench.tree_search import TreeSearchConfig, search_tree
from vllm_clover.demo import DemoConfig, run_demo
from vllm_clover.eagle3.config import Eagle3TrainConfig
from vllm_clover.make_heads import MakeHeadsConfig, make_heads
from vllm_clover.training.config import (
    EvalConfig,
    ExportMedusaConfig,
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


def _run(module: str, function: str) -> Callable[[Any], None]:
    """The command's function from a module that imports torch, imported when it runs, so
    that `--help` and flag errors stay fast (the config modules above import neither)."""
    return lambda config: getattr(importlib.import_module(module), function)(config)


def _print_train(config: TrainConfig) -> None:
    from vllm_clover.training.trainer import train

    print(train(config).summary())


def _print_train_eagle3(config: Eagle3TrainConfig) -> None:
    from vllm_clover.eagle3.train import summary, train_eagle3

    print(summary(train_eagle3(config), config.out))


# name: (flags' dataclass, help, what runs it)
COMMANDS: dict[str, tuple[type, str, Callable[[Any], None]]] = {
    "demo": (
        DemoConfig,
        "Clover vs vanilla on MT-Bench with the reference target: output equality, "
        "acceptance, speedup",
        run_demo,
    ),
    "make-heads": (
        MakeHeadsConfig,
        "one command from a target to served heads: self-distil, train, evaluate, check "
        "through vLLM (resumable)",
        make_heads,
    ),
    "search-tree": (
        TreeSearchConfig,
        "measure a wide token tree's node acceptance through vLLM; the best subtree of each "
        "size, optionally written as the heads' default tree",
        search_tree,
    ),
    "train": (TrainConfig, "distil Clover (or --medusa) heads from a frozen target", _print_train),
    "generate-data": (
        GenerateConfig,
        "regenerate assistant turns with the target",
        _run("vllm_clover.training.generate_data", "generate_data"),
    ),
    "eval-heads": (
        EvalConfig,
        "offline head accuracy and chain acceptance",
        _run("vllm_clover.training.evaluate", "eval_heads"),
    ),
    "train-eagle3": (
        Eagle3TrainConfig,
        "an EAGLE-3 drafter, speculators format",
        _print_train_eagle3,
    ),
    "export-medusa": (
        ExportMedusaConfig,
        "write Medusa-configured heads (train --medusa) in vLLM's native Medusa format",
        _run("vllm_clover.training.medusa_export", "export_medusa_command"),
    ),
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
    bench = commands.add_parser(
        "bench",
        help="vanilla, ngram, Medusa and Clover through vLLM "
        "on the same prompts: throughput, tau, acceptance, equality",
    )
    add_arguments(bench, BenchFlags)
    for name, (config, text, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=text, description=text), config)
    return parser


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
        elif args.command == "bench":
            from vllm_clover.bench.runner import bench_command

            bench_command(args, argv)
        else:
            config, _, run = COMMANDS[args.command]
            run(from_args(args, config))
    except AssetError as err:
        print(f"vllm-clover: error: {err}", file=sys.stderr)
        return 2
    except (TrainingError, BenchError) as err:
        print(f"vllm-clover {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
