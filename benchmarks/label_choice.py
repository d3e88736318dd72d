"""Why soft labels: distil the target's distribution vs train on the data's tokens (Medusa-1).

    .venv/bin/python benchmarks/label_choice.py [--samples 48] [--epochs 3] [--json out.json]

Trains the same Clover heads on the reference target twice on the same ShareGPT slice (answers
written by ChatGPT, not by the target), once with soft labels (``softmax(W_lm H_{t+1+i})``)
and once with one-hot data tokens, then evaluates both on the same held-out split with
`eval-heads` metrics: top-1/top-5 against the target's argmax and the implied chain
acceptance. Run it on CPU with a draft vocabulary to keep it to a couple of minutes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--max-seq-len", type=int, default=192)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--eval-fraction", type=float, default=0.25)
    parser.add_argument("--cache-dir", help="hidden-state cache root (default: the user cache)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    return parser.parse_args()


def main() -> None:
    import torch

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.training import TrainConfig, train
    from vllm_clover.training.evaluate import format_table

    args = _parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory(prefix="clover-labels-") as tmp:
        for name, soft in (
            ("soft labels (target distribution)", True),
            ("hard labels (data tokens)", False),
        ):
            result = train(
                TrainConfig(
                    target=str(fetch_reference_target()),
                    out=str(Path(tmp) / name[:4]),
                    max_samples=args.samples,
                    max_seq_len=args.max_seq_len,
                    epochs=args.epochs,
                    eval_fraction=args.eval_fraction,
                    draft_vocab_size=args.draft_vocab_size,
                    batch_size=args.batch_size,
                    lr=args.lr,
                    soft_labels=soft,
                    cache_dir=args.cache_dir,
                    eval_every=0,
                    save_every=0,
                    progress=False,
                )
            )
            results[name] = result.eval
    print(
        f"reference target, {args.samples} ShareGPT conversations (<= {args.max_seq_len} "
        f"tokens), {args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, draft vocab "
        f"{args.draft_vocab_size}:"
    )
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "results": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
