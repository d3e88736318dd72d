"""`vllm-clover train`: distil Clover (or Medusa) heads from a frozen target.

Flow: target -> tokenised split -> hidden-state cache -> heads -> AdamW over a precomputed
step plan -> periodic eval and state -> final checkpoint + model card. Under torchrun (DDP)
N processes at batch B give the update of one at batch N*B.
How it works: docs/design/training-internals.md, "The training loop".
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from vllm_clover.modeling import CloverModel, save_clover
from vllm_clover.training.card import model_card
from vllm_clover.training.config import TrainConfig, TrainingError
from vllm_clover.training.data import plan_steps
from vllm_clover.training.evaluate import evaluate
from vllm_clover.training.loss import (
    HeadStats,
    distill_loss,
    graded_positions,
    head_cross_entropy,
    head_weights,
)
from vllm_clover.training.network import build_model, preflight
from vllm_clover.training.pipeline import DataSpec, Prepared, prepare
from vllm_clover.training.runtime import (
    Runtime,
    current_memory_bytes,
    describe_hardware,
    init_runtime,
    peak_memory_bytes,
    reset_peak_memory,
    seed_everything,
    set_rng_state,
    shutdown_runtime,
    trim_heap_after,
)
from vllm_clover.training.schedule import TimeBudget, warmup_cosine
from vllm_clover.training.state import load_state, save_state
from vllm_clover.training.warm_start import InitCheckpoint


@dataclass
class TrainResult:
    out: Path | None  # None when stopped early (--stop-after)
    steps: int  # optimizer steps done in total
    tokens_seen: int
    train_seconds: float  # time in optimizer steps of this invocation (no caching, no eval)
    tokens_per_second: float  # global training tokens per second of this invocation
    start_memory_bytes: int | None  # when the loop started (CUDA allocated or process RSS)
    peak_memory_bytes: int | None  # peak over the training loop (same measure)
    eval: dict[str, Any] | None
    history: list[dict[str, Any]] = field(default_factory=list)
    planned_steps: int = 0  # more than steps where --time-budget cut the plan

    def summary(self) -> str:
        """The lines `train` ends with: what ran, the held-out figures, any budget cut."""
        lines = [
            f"{self.steps} steps, {self.tokens_seen} tokens, {self.tokens_per_second:.0f} "
            f"tokens/s -> {self.out or 'stopped (resumable)'}"
        ]
        if self.eval:
            top1 = " ".join(f"{a:.3f}" for a in self.eval["top1"])
            lines.append(
                f"held-out answers: top-1 per head {top1}, offline tau {self.eval['tau']:.2f} "
                "(expected tokens per step at T = 0, every head drafting)"
            )
        if self.out and self.planned_steps > self.steps:
            lines.append(
                f"--time-budget cut the plan: {self.steps} of {self.planned_steps} steps ran"
            )
        return "\n".join(lines)


class HeadFeatures(nn.Module):
    """DDP needs a forward: (H (B, T, D), head inputs (B, T, K)) -> z (B, T, K, D)."""

    def __init__(self, model: CloverModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, hidden: torch.Tensor, head_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.head_features(hidden, head_input_ids)


def train(cfg: TrainConfig) -> TrainResult:
    """Run (or resume) one training job and return what it did."""
    started = time.monotonic()  # --time-budget counts from here
    runtime = init_runtime(cfg.device)
    try:
        return _train(cfg, runtime, started)
    finally:
        shutdown_runtime(runtime)


def _train(cfg: TrainConfig, runtime: Runtime, started: float) -> TrainResult:
    if Path(cfg.out).exists() and not cfg.overwrite:
        raise TrainingError(f"output folder {cfg.out} already exists (pass --overwrite)")
    resumed = load_state(cfg.state_dir, cfg) if cfg.resume else None
    init = InitCheckpoint.read(cfg) if cfg.init_from else None
    seed_everything(cfg.seed)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    draft_ids = init.draft_vocab_ids if init else None
    check = None if init else lambda teacher: preflight(cfg, teacher)
    prepared = prepare(DataSpec.from_config(cfg), runtime, dtype, draft_ids=draft_ids, check=check)
    model = build_model(cfg, prepared, runtime.device)
    if init is not None:
        init.load_into(model, prepared.teacher.lm_head, cfg.target)
    prepared.release_teacher()
    global_batch = cfg.batch_size * cfg.grad_accum * runtime.world_size
    plan = plan_steps(
        [len(s) for s in prepared.train], global_batch, cfg.epochs, cfg.seed, cfg.max_tokens
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay
    )
    planned = len(plan)  # before --time-budget cuts it
    scheduler = warmup_cosine(optimizer, plan, cfg.warmup_fraction)
    modules = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    start, tokens_seen = 0, 0
    if resumed is not None:
        if resumed["planned_steps"] != planned:
            raise TrainingError(
                f"cannot resume: the saved run planned {resumed['planned_steps']} "
                f"steps, this one {planned} (different data?)"
            )
        del plan[resumed["total_steps"] :]  # a cut made by --time-budget stays
        for name, module in modules.items():
            module.load_state_dict(resumed[name])
        start, tokens_seen = resumed["step"], resumed["tokens_seen"]
        set_rng_state(resumed["rng"])
    budget = TimeBudget(cfg.time_budget, started)
    loop = TrainLoop(cfg, runtime, prepared, model, optimizer, scheduler, plan, planned, budget)
    return loop.run(start, tokens_seen, modules)


def show_progress(bar: Any, entry: dict[str, Any], tokens_per_second: float) -> None:
    """Advance the progress bar by one step and show its loss, lr, top-1 and speed."""
    bar.update(1)
    top1 = "/".join(f"{a:.2f}" for a in entry["top1"])
    bar.set_postfix(
        loss=f"{entry['loss']:.3f}",
        lr=f"{entry['lr']:.2e}",
        batch_top1=top1,  # the training batches' own, not held-out: train prints that at the end
        tok_s=f"{tokens_per_second:.0f}",
    )


class TrainLoop:
    """The optimizer-step loop; one instance per run (state lives in the optimizer/scheduler)."""

    def __init__(
        self,
        cfg: TrainConfig,
        runtime: Runtime,
        prepared: Prepared,
        model: CloverModel,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        plan: list[list[int]],
        planned: int,
        budget: TimeBudget,
    ) -> None:
        self.cfg, self.runtime, self.prepared, self.model = cfg, runtime, prepared, model
        self.optimizer, self.scheduler, self.plan = optimizer, scheduler, plan
        self.planned, self.budget = planned, budget
        self.weights = head_weights(cfg.num_heads, cfg.head_weight_base).to(runtime.device)
        self.cross_entropy = (
            torch.compile(head_cross_entropy, dynamic=True)
            if cfg.compile_heads
            else head_cross_entropy
        )
        wrapped = HeadFeatures(model)
        if runtime.distributed:
            ids = [runtime.device.index] if runtime.device.type == "cuda" else None
            wrapped = DistributedDataParallel(wrapped, device_ids=ids, broadcast_buffers=False)
        self.wrapped = torch.compile(wrapped, dynamic=True) if cfg.compile_heads else wrapped
        self.history: list[dict[str, Any]] = []

    def micro_batches(self, step: int) -> list[list[int]]:
        """This process's micro-batches of global step ``step``: slice (m * world + rank)."""
        b, w, r = self.cfg.batch_size, self.runtime.world_size, self.runtime.rank
        ids = self.plan[step]
        return [ids[(m * w + r) * b : (m * w + r + 1) * b] for m in range(self.cfg.grad_accum)]

    def train_step(self, step: int) -> HeadStats:
        """One optimizer step over the global batch; returns the all-reduced head stats."""
        cfg, rt, k = self.cfg, self.runtime, self.cfg.num_heads
        batches = [
            self.prepared.batch([self.prepared.train[j] for j in ids]).to(rt.device)
            for ids in self.micro_batches(step)
        ]
        graded = [graded_positions(batch, k) for batch in batches]
        normaliser = rt.all_reduce_sum(sum(v.sum(dim=(0, 1)).double() for _, v in graded))
        stats = HeadStats.zeros(k, rt.device)
        for m, (batch, (tokens, valid)) in enumerate(zip(batches, graded, strict=True)):
            last = m == len(batches) - 1
            accumulate = rt.distributed and not last  # DDP: all-reduce only on the last one
            sync = self.wrapped.no_sync() if accumulate else contextlib.nullcontext()
            with (
                sync,
                torch.autocast(rt.device.type, torch.bfloat16, enabled=cfg.dtype == "bfloat16"),
            ):
                features = self.wrapped(batch.hidden, tokens.input_ids)  # (B, T, K, D)
                loss, micro, _, _ = distill_loss(
                    self.model,
                    features,
                    batch,
                    valid,
                    self.weights,
                    normaliser.float(),
                    cfg.hidden_loss_weight,
                    cfg.soft_labels,
                    self.cross_entropy,
                    cfg.label_top_k,
                )
                (loss * rt.world_size).backward()  # DDP averages; we want the global sum
            stats.add_(micro)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return HeadStats.from_stacked(rt.all_reduce_sum(stats.stacked()))

    def log_step(
        self, step: int, stats: HeadStats, tokens_seen: int, seconds: float
    ) -> dict[str, Any]:
        means = stats.means()
        w = self.weights.tolist()
        loss = sum(
            wi * (ce + self.cfg.hidden_loss_weight * hl)
            for wi, ce, hl in zip(w, means["ce"], means["hidden"], strict=True)
        )
        entry = {
            "step": step + 1,
            "loss": loss,
            "top1": means["top1"],
            "lr": self.scheduler.get_last_lr()[0],
            "tokens_seen": tokens_seen,
            "seconds": seconds,  # this step's wall time
        }
        self.history.append(entry)
        return entry

    def evaluate(self) -> dict[str, Any] | None:
        """Held-out metrics on rank 0 (others wait); None without a held-out set."""
        result = None
        if self.runtime.is_main and self.prepared.eval:
            result = evaluate(
                self.model,
                self.prepared,
                self.prepared.eval,
                self.cfg.batch_size,
                self.runtime.device,
            ).summary()
        self.runtime.barrier()
        return result

    def save(self, modules: dict[str, Any], step: int, tokens_seen: int) -> None:
        if self.runtime.is_main:
            save_state(
                self.cfg.state_dir,
                self.cfg,
                modules,
                step,
                tokens_seen,
                len(self.plan),
                self.planned,
            )
        self.runtime.barrier()

    def run(self, start: int, tokens_seen: int, modules: dict[str, Any]) -> TrainResult:
        cfg, rt = self.cfg, self.runtime
        bar = tqdm(
            total=len(self.plan),
            initial=start,
            desc="train",
            unit="step",
            disable=not (cfg.progress and rt.is_main),
        )
        seconds, tokens_now, evaluation = 0.0, 0, None
        gc.collect()  # the released target model
        reset_peak_memory(rt.device)
        start_memory = current_memory_bytes(rt.device)
        step, stop = start, len(self.plan)
        if cfg.stop_after is not None:
            stop = min(stop, start + cfg.stop_after)
        while step < stop:
            began = time.perf_counter()
            stats = self.train_step(step)
            step_seconds = time.perf_counter() - began
            seconds += step_seconds
            step_tokens = sum(len(self.prepared.train[j]) for j in self.plan[step])
            tokens_seen, tokens_now = tokens_seen + step_tokens, tokens_now + step_tokens
            entry = self.log_step(step, stats, tokens_seen, step_seconds)
            step += 1
            stop = min(stop, self.fit_budget(step, step - start, bar))
            show_progress(bar, entry, tokens_now / max(seconds, 1e-9))
            evaluation = self.between_steps(step, stop, modules, tokens_seen, bar) or evaluation
        bar.close()
        peak = peak_memory_bytes(rt.device)
        self.save(modules, step, tokens_seen)
        out = None
        if step == len(self.plan):
            evaluation = self.evaluate()
            out = self.finish(step, tokens_seen, evaluation, seconds)
        rate = tokens_now / max(seconds, 1e-9)
        return TrainResult(
            out,
            step,
            tokens_seen,
            seconds,
            rate,
            start_memory,
            peak,
            evaluation,
            self.history,
            self.planned,
        )

    def fit_budget(self, step: int, done: int, bar: Any) -> int:
        """Cut the plan to what --time-budget allows (rank 0 decides for all); its length."""
        fit = self.budget.plan_length(step, done, len(self.plan))
        if self.runtime.distributed and self.budget.checks_at(done):
            mine = torch.tensor([fit if self.runtime.is_main else 0], device=self.runtime.device)
            fit = int(self.runtime.all_reduce_sum(mine).item())
        if fit < len(self.plan):
            bar.write(f"--time-budget: plan cut from {len(self.plan)} to {fit} steps")
            del self.plan[fit:]
            bar.total = fit
        return len(self.plan)

    def between_steps(
        self, step: int, stop: int, modules: dict[str, Any], tokens_seen: int, bar: Any
    ) -> dict[str, Any] | None:
        """Periodic held-out evaluation (returned), resumable state and heap trim, after `step`
        steps."""
        cfg, evaluation = self.cfg, None
        trim_heap_after(step, self.runtime.device)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < len(self.plan):
            evaluation = self.evaluate()
            if evaluation:
                bar.write(
                    f"step {step}: held-out top1 {evaluation['top1']} tau {evaluation['tau']:.3f}"
                )
        if cfg.save_every and step % cfg.save_every == 0 and step < stop:
            self.save(modules, step, tokens_seen)
        return evaluation

    def finish(
        self, steps: int, tokens_seen: int, evaluation: dict[str, Any] | None, seconds: float
    ) -> Path:
        """Write the final checkpoint (rank 0) with its model card; atomic."""
        summary = {
            "eval": evaluation,
            "steps": steps,
            "planned_steps": self.planned,  # more than steps when --time-budget cut the plan
            "tokens_seen": tokens_seen,
            "seconds": seconds,
            "hardware": describe_hardware(self.runtime.device),
            "train_sequences": len(self.prepared.train),
            "eval_sequences": len(self.prepared.eval),
            "world_size": self.runtime.world_size,
            "final_loss": self.history[-1]["loss"] if self.history else float("nan"),
            "train_top1_vocabulary": (
                "full" if self.prepared.train_cache is self.prepared.cache else "draft"
            ),
        }
        if self.runtime.is_main:
            card = model_card(self.cfg, self.model.config, summary)
            save_clover(
                self.model,
                self.model.config,
                self.cfg.out,
                card,
                overwrite=self.cfg.overwrite,
                dtype=getattr(torch, self.cfg.save_dtype),
            )
        self.runtime.barrier()
        return Path(self.cfg.out)
