"""What a freshly initialised Augmenting Block does to the feature every chain starts from.

`train` copies the target's last L decoder layers and final norm into the block. Those layers
were trained to read the *residual stream* entering them; the block reads the target's
*post-norm* hidden state H (what vLLM hands a drafter). This measures, on real text, how often
the target's LM head gives the same token on the block's output as on H itself:

    post_norm_input   block(H), what the block computes at step 0 of training and serving
    pre_norm_input    block(the residual stream into the target's last L layers): the input
                      the copied layers expect; 1.0 means the copy is exact
    gated             H + g * (block(H) - H), the model's own gated output with g as a fresh
                      model initialises it (``--augmenting-gate`` at step 0)

A low post_norm_input is a block that starts by destroying h0, which the heads must then
relearn from scratch (docs/heads.md, "Why the Augmenting Block hurt").

    python benchmarks/block_init.py --data mt-self.jsonl --json docs/bench/heads/block_init.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vllm_clover.modeling import CloverConfig, CloverModel
from vllm_clover.training.data import load_conversations, tokenize_all
from vllm_clover.training.teacher import augmenting_init, load_teacher


def agreement(model: CloverModel, teacher, sequences, depth: int) -> dict[str, float]:
    """Top-1 agreement with the target on each input the block could read (module docstring)."""
    hits = {"post_norm_input": 0, "pre_norm_input": 0, "gated": 0}
    total = 0
    w = teacher.lm_head  # (V, D)
    for ids in sequences:
        ids = ids.unsqueeze(0)  # (1, T)
        with torch.no_grad():
            out = teacher.model(ids, output_hidden_states=True)
            h = out.hidden_states[-1]  # (1, T, D) post-norm H
            stream = out.hidden_states[-1 - depth]  # (1, T, D) input of the last `depth` layers
            want = (h @ w.T).argmax(-1)  # (1, T)
            outputs = {
                "post_norm_input": model.augmenting(h),
                "pre_norm_input": model.augmenting(stream),
                "gated": model.augment(h, ids),  # through BlockAdapter, gate as initialised
            }
        for name, feature in outputs.items():
            hits[name] += int(((feature @ w.T).argmax(-1) == want).sum())
        total += ids.numel()
    return {name: count / total for name, count in hits.items()} | {"tokens": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--data", required=True, help="conversations, as `train --data` reads")
    parser.add_argument("--max-samples", type=int, default=24)
    parser.add_argument("--max-seq-len", type=int, default=576)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    teacher = load_teacher(args.target, torch.device("cpu"), torch.float32)
    records = load_conversations(args.data, args.max_samples)
    tokenized = tokenize_all(teacher.tokenizer, records, args.max_seq_len, args.data)
    sequences = [s.input_ids for s in tokenized]
    results = {}
    for depth in args.layers:
        config = CloverConfig.from_target_config(
            teacher.config, num_heads=1, num_augmenting_layers=depth, augmenting_gate=True
        )
        model = CloverModel(config)
        model.augmenting.init_from_target(*augmenting_init(teacher, depth))
        results[f"layers={depth}"] = agreement(model, teacher, sequences, depth)
        print(depth, json.dumps(results[f"layers={depth}"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            record = {"target": args.target, "data": Path(args.data).name, **results}
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
