"""`vllm-clover train-eagle3`: an EAGLE-3 drafter distilled from the same data, cache and
teacher signal as the Clover heads, saved in the speculators format vLLM loads.

    train_eagle3(Eagle3TrainConfig(target="smollm2-135m-instruct", out="eagle3", max_samples=300))

One process (no DDP). The flow: docs/design/network.md, "Training the drafter: eagle3/train.py".
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from vllm_clover.eagle3.checkpoint import save_eagle3
from vllm_clover.eagle3.config import Eagle3Config, Eagle3TrainConfig
from vllm_clover.eagle3.loss import eagle3_loss, evaluate
from vllm_clover.eagle3.network import Eagle3Drafter
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import plan_steps
from vllm_clover.training.flags import to_command_line
from vllm_clover.training.pipeline import DataSpec, Prepared, prepare
from vllm_clover.training.runtime import (
    init_runtime,
    seed_everything,
    shutdown_runtime,
    trim_heap_after,
)
from vllm_clover.training.schedule import warmup_cosine


def train_eagle3(cfg: Eagle3TrainConfig) -> dict[str, object]:
    """Train and save the drafter; returns what it printed (steps, tokens/s, held-out)."""
    runtime = init_runtime(cfg.device)
    try:
        seed_everything(cfg.seed)
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        layers = tuple(cfg.aux_layers or ())
        if not layers:
            n = prepare_layers_count(cfg.target)
            layers = (2, n // 2, n - 3)
        spec = dataclasses.replace(DataSpec.from_config(cfg), target_layers=layers)
        prepared = prepare(spec, runtime, dtype)
        drafter = build_drafter(cfg, prepared, layers).to(runtime.device)
        prepared.release_teacher()
        result = fit(cfg, prepared, drafter, runtime.device)
        held = prepared.eval
        batches = (prepared.batch(held[i : i + 8]) for i in range(0, len(held), 8))
        result["held_out"] = evaluate(drafter, batches, runtime.device).summary() if held else {}
        save_eagle3(drafter, Path(cfg.out), prepared.teacher.path, card(cfg, result))
        return result
    finally:
        shutdown_runtime(runtime)


def prepare_layers_count(target: str) -> int:
    from transformers import AutoConfig

    from vllm_clover.training.teacher import resolve_target

    path, kwargs = resolve_target(target)
    return AutoConfig.from_pretrained(path, **kwargs).num_hidden_layers


def build_drafter(cfg: Eagle3TrainConfig, prepared: Prepared, layers) -> Eagle3Drafter:
    """A fresh drafter for the target: the draft vocabulary from the training split's
    counts, the target's rows of it as the (frozen) LM head, the target's input embedding."""
    teacher = prepared.teacher
    ids = prepared.draft_vocab_ids
    if ids is None:
        ids = torch.arange(int(teacher.lm_head.shape[0]))
    config = Eagle3Config.from_target(teacher.config, len(ids), layers, cfg.ttt_steps)
    embed = teacher.model.get_input_embeddings().weight.detach()
    drafter = Eagle3Drafter(config, embed, ids)
    with torch.no_grad():
        drafter.lm_head.weight.copy_(teacher.lm_head[ids])
    drafter.lm_head.weight.requires_grad_(False)
    return drafter


def fit(cfg: Eagle3TrainConfig, prepared: Prepared, drafter: Eagle3Drafter, device) -> dict:
    """The optimizer steps of the plan; tokens/s of the loop."""
    plan = plan_steps(
        [len(s) for s in prepared.train], cfg.batch_size, cfg.epochs, cfg.seed, cfg.max_tokens
    )
    if not plan:
        raise TrainingError(
            f"no training step: {len(prepared.train)} sequences for batch {cfg.batch_size}"
        )
    trained = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=cfg.lr, betas=(0.9, 0.999))
    scheduler = warmup_cosine(optimizer, plan, cfg.warmup_fraction)
    tokens, losses, started = 0, [], time.perf_counter()
    for step, ids in enumerate(plan, 1):
        batch = prepared.batch([prepared.train[i] for i in ids]).to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
            loss, _ = eagle3_loss(drafter, batch, cfg.step_decay)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trained, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(batch.attention_mask.sum())
        losses.append(float(loss.detach()))
        trim_heap_after(step, device)
    seconds = time.perf_counter() - started
    return {
        "steps": len(plan),
        "tokens": tokens,
        "tokens_per_second": tokens / seconds,
        "losses": losses,
    }


def summary(result: dict, out: str) -> str:
    """What `train-eagle3` prints: the run, then the held-out figures (when there is a split)."""
    held = result.get("held_out") or {}
    top1 = " ".join(f"{a:.3f}" for a in held.get("top1", []))
    line = (
        f"{result['steps']} steps, {result['tokens']} tokens, "
        f"{result['tokens_per_second']:.0f} tokens/s -> {out}"
    )
    if not held:
        return line
    return f"{line}\nheld-out answers: top-1 per step {top1}, offline tau {held['tau']:.3f}"


def card(cfg: Eagle3TrainConfig, result: dict) -> str:
    """The folder's README.md: what it is, how it was made, its held-out figures."""
    return (
        f"# EAGLE-3 drafter for `{cfg.target}` (speculators format)\n\n"
        f'`LLM(model=TARGET, speculative_config={{"method": "eagle3", "model": "<this folder>", '
        f'"num_speculative_tokens": {cfg.ttt_steps}}})`\n\n'
        f"Made with `{to_command_line(cfg, 'vllm-clover train-eagle3')}`:\n\n"
        f"{summary(result, cfg.out)}\n\n"
        "Held-out figures: teacher-forced greedy chains of the TTT steps (docs/training.md).\n"
    )
