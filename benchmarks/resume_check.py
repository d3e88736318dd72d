"""Did a resumed run continue exactly? Compare two training-state folders tensor by tensor.

A long run saves its state every --save-every steps (``<out>.train-state``). Copy the state
at step S aside, let the run go on to step S + N and copy that state too; resume the first
copy for N steps; the two states at S + N must be identical (heads, AdamW moments, scheduler,
step and token counts)::

    cp -r run.train-state s100                          # when trainer.json says step 100
    cp -r run.train-state s200                          # when it says step 200
    vllm-clover train <the run's flags> --out resumed --resume s100 --stop-after 100
    python benchmarks/resume_check.py s100 s200 --json docs/bench/heads/resume_check.json

(``--resume s100`` writes its state back into s100, which then holds step 200.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def tensors(payload: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state payload, by its dotted path."""
    if isinstance(payload, torch.Tensor):
        return {prefix: payload}
    if isinstance(payload, dict):
        items = payload.items()
    elif isinstance(payload, list | tuple):
        items = enumerate(payload)
    else:
        return {}
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def compare(a: Path, b: Path) -> dict[str, object]:
    """Steps, tokens and the largest difference of every tensor between two state folders."""
    sa, sb = (torch.load(p / "state.pt", map_location="cpu", weights_only=False) for p in (a, b))
    ta, tb = (
        tensors({k: sa[k] for k in ("model", "optimizer")}),
        tensors({k: sb[k] for k in ("model", "optimizer")}),
    )
    if ta.keys() != tb.keys():
        raise SystemExit(f"different tensors: {sorted(ta.keys() ^ tb.keys())[:5]}")
    diffs = {k: float((ta[k].double() - tb[k].double()).abs().max()) for k in ta if ta[k].numel()}
    return {
        "a": str(a),
        "b": str(b),
        "steps": [sa["step"], sb["step"]],
        "tokens_seen": [sa["tokens_seen"], sb["tokens_seen"]],
        "scheduler_equal": sa["scheduler"] == sb["scheduler"],
        "tensors": len(diffs),
        "max_abs_difference": max(diffs.values()),
        "identical": all(d == 0 for d in diffs.values()) and sa["step"] == sb["step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path, help="a training-state folder")
    parser.add_argument("b", type=Path, help="another, at the same step")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = compare(args.a, args.b)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
