"""The model card (README.md) written into every trained Clover checkpoint."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from vllm_clover.modeling import CloverConfig
from vllm_clover.training.config import TrainConfig
from vllm_clover.training.evaluate import format_table
from vllm_clover.training.flags import to_command_line


def variant_name(config: CloverConfig) -> str:
    if config.is_medusa:
        return "Medusa-1 heads (all Clover components off)"
    parts = [
        name
        for flag, name in (
            (config.fuse_next_token, "next-token fusion"),
            (config.use_augmenting_block, f"Augmenting Block x{config.num_augmenting_layers}"),
            (config.augmenting_gate, "gated"),
            (config.use_attention_decoder, "Attention Decoder"),
            (config.use_regressive_connection, "Regressive Connection"),
            (config.head_projection == "linear", "linear head projections"),
        )
        if flag
    ]
    return "Clover: " + " + ".join(parts)


def model_card(cfg: TrainConfig, config: CloverConfig, summary: dict[str, Any]) -> str:
    """Markdown: what was trained, on what, how, and how well (held-out metrics)."""
    evaluation = summary.get("eval")
    table = format_table({"held-out": evaluation}) if evaluation else "(no held-out set)"
    vocab = config.draft_vocab_size or f"full ({config.vocab_size})"
    settings = {
        k: v
        for k, v in dataclasses.asdict(cfg).items()
        if k not in ("resume", "overwrite", "progress", "stop_after")
    }
    kind = "Medusa-1 baseline heads" if config.is_medusa else "Clover draft heads"
    return f"""# {kind} for `{cfg.target}` (vllm-clover format)

{variant_name(config)}; {config.num_heads} heads, draft vocabulary {vocab}.
Trained with `vllm-clover train` (self-distillation against the frozen target's own
distribution; see docs/training.md of vllm-clover).

## Use with vLLM 0.32 (vllm-clover plugin)

{vllm_usage(cfg.target, "clover", config.num_heads)}

## Training

{_training_table(cfg, summary)}

## Held-out evaluation (teacher-forced, vs the target's argmax)

{table}

`E[accepted]`: expected accepted drafts of one greedy chain; `tau` = 1 + E[accepted].

## Full configuration

```json
{json.dumps(settings, indent=2)}
```
"""


def vllm_usage(target: str, method: str, num_heads: int) -> str:
    """A card's Python block: vLLM's `LLM` on `target` drafting with the card's folder."""
    return f"""```python
LLM(
    model="{target}",
    speculative_config={{
        "method": "{method}",
        "model": "<this folder>",
        "num_speculative_tokens": {num_heads},
    }},
)
```"""


def _training_table(cfg: TrainConfig, summary: dict[str, Any]) -> str:
    """The card's "Training" table: command, data, budget, loss, optimiser, wall time."""
    return f"""| | |
|---|---|
| command | `{to_command_line(cfg)}` |
| data | {cfg.data or "bundled ShareGPT"} |
| started from | {f"`{cfg.init_from}` (--init-from)" if cfg.init_from else "a fresh network"} |
| sequences | {summary["train_sequences"]} train / {summary["eval_sequences"]} held-out, \
max {cfg.max_seq_len} tokens |
| steps | {summary["steps"]} optimizer steps, {summary["tokens_seen"]} tokens |
| planned steps | {summary.get("planned_steps", summary["steps"])} |
| processes | {summary["world_size"]} x batch {cfg.batch_size} x grad accum {cfg.grad_accum} |
| loss | {_labels(cfg)}, \
head weights {cfg.head_weight_base}^i; \
+ {cfg.hidden_loss_weight} x SmoothL1(hidden) |
| optimiser | AdamW(0.9, 0.999) lr {cfg.lr}, \
warmup {cfg.warmup_fraction:.0%} then cosine, clip {cfg.grad_clip} |
| final train loss | {summary["final_loss"]:.4f} |
| training top-1 vs | the target's argmax over the \
{summary.get("train_top1_vocabulary", "full")} vocabulary (held-out: always the full one) |
| wall time | {summary["seconds"]:.0f} s in the training loop on {summary["hardware"]} |"""


def _labels(cfg: TrainConfig) -> str:
    """What the heads were graded against, as the card's loss row says it."""
    if not cfg.soft_labels:
        return "hard-label CE vs data"
    if cfg.label_top_k:
        return f"soft-label CE vs the target's top {cfg.label_top_k}, renormalised"
    return "soft-label CE vs target"
