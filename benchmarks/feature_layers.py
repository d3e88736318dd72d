"""Probe: do the heads draft better when they also read the target's intermediate layers?

EAGLE-3 feeds its draft layer a fusion of a low, a middle and a high layer of the target
instead of the last hidden state alone. This probe trains the reference configuration
(Clover-2 + gate, the trainer's defaults for it) at one token budget per variant, each
variant reading

    x_t = H_t + sum_j W_j rmsnorm(L_j(t))       W_j (D, D), zero at init

where H_t is the last layer after the final norm (what vLLM hands a proposer today) and
L_j(t) the residual stream after decoder layer j (``--variants 2,15,27``: layers 2, 15, 27;
``none``: H alone, the control). Zero-initialised, every variant starts as the control and
sees the same data in the same order with the same seed; each is then scored as
`vllm-clover eval-heads` scores a checkpoint (teacher-forced, float32 target and heads,
``evaluate`` itself). Every optimizer step is the trainer's own (``TrainLoop.train_step``:
`distill_loss`, AdamW groups, warmup + cosine, clipping, bfloat16 autocast), over signals
held in memory instead of the hidden-state cache.

It needs no vLLM. Serving such heads would need the target's intermediate hidden states from
vLLM's model runner, which this probe does not build: it only says whether they are worth it.

    python benchmarks/feature_layers.py \
        --data data/smollm2-135m-instruct-sharegpt-answers.jsonl.xz --max-samples 1500 \
        --eval-data mt-self.jsonl --max-tokens 400000 --variants none 2,15,27 15 \
        --json docs/bench/heads/feature_layers_400k.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn as nn

from vllm_clover.modeling import CloverModel
from vllm_clover.modeling.augmenting import RMSNorm
from vllm_clover.modeling.tables import draft_vocab_from_counts
from vllm_clover.training.cache import padded_batch
from vllm_clover.training.config import TrainConfig
from vllm_clover.training.data import (
    Batch,
    TokenizedSequence,
    collate,
    load_conversations,
    plan_steps,
    split_train_eval,
    token_counts,
    tokenize_all,
)
from vllm_clover.training.evaluate import evaluate
from vllm_clover.training.network import build_model
from vllm_clover.training.runtime import init_runtime
from vllm_clover.training.schedule import TimeBudget, warmup_cosine
from vllm_clover.training.teacher import Teacher, argmax_rows, load_teacher
from vllm_clover.training.trainer import TrainLoop, parameter_groups

CPU = torch.device("cpu")


@dataclass
class Signal:
    """One sequence's teacher signal: H (T, D), full-vocabulary argmax (T,), layers (T, A, D)."""

    hidden: torch.Tensor
    top1: torch.Tensor
    layers: torch.Tensor


@torch.no_grad()
def teacher_signals(
    teacher: Teacher, sequences: list[TokenizedSequence], layers: list[int], batch_tokens: int
) -> dict[str, Signal]:
    """One target forward per batch of similar lengths; every tensor kept in bfloat16."""
    model, weight = teacher.model, teacher.model.get_output_embeddings().weight
    order = sorted(sequences, key=len)
    signals, i = {}, 0
    while i < len(order):
        rows = max(1, batch_tokens // len(order[i]))
        group = order[i : i + rows]
        i += rows
        ids, mask = padded_batch(group, 0, len(group))  # (B, T) right-padded
        out = model(ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
        hidden = out.hidden_states[-1]  # (B, T, D), post-norm
        top1 = argmax_rows(hidden, weight)  # (B, T)
        picked = [out.hidden_states[j] for j in layers] or [hidden[:, :, :0]]
        stack = torch.stack(picked, dim=2)  # (B, T, A, D); A = 0 without layers
        for r, s in enumerate(group):
            n = len(s)
            signals[s.key] = Signal(
                hidden[r, :n].to(torch.bfloat16),
                top1[r, :n].to(torch.int32),
                stack[r, :n].to(torch.bfloat16),
            )
    return signals


class LayerFusion(nn.Module):
    """sum_j W_j rmsnorm(L_j): (B, T, A, D) -> (B, T, D); zero at init."""

    def __init__(self, num_layers: int, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(hidden_size, eps) for _ in range(num_layers))
        self.projs = nn.ModuleList(
            nn.Linear(hidden_size, hidden_size, bias=False) for _ in range(num_layers)
        )
        for proj in self.projs:
            nn.init.zeros_(proj.weight)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        parts = [
            p(n(layers[:, :, j].float()))
            for j, (n, p) in enumerate(zip(self.norms, self.projs, strict=True))
        ]
        return torch.stack(parts).sum(0)  # (B, T, D)


class SignalBatches:
    """``Prepared.batch`` for ``evaluate`` and the loop; keeps the last batch's layers."""

    def __init__(self, signals: dict[str, Signal]) -> None:
        self.signals = signals
        self.layers: torch.Tensor | None = None  # (B, T, A, D) of the last batch

    def batch(self, sequences: list[TokenizedSequence]) -> Batch:
        sig = [self.signals[s.key] for s in sequences]
        batch = collate(sequences, [(x.hidden, x.top1) for x in sig])
        a, d = sig[0].layers.shape[1:]
        self.layers = torch.zeros(len(sig), batch.input_ids.shape[1], a, d, dtype=torch.bfloat16)
        for r, x in enumerate(sig):
            self.layers[r, : len(x.layers)] = x.layers
        return batch


class FusedHeads(nn.Module):
    """A CloverModel whose input is H plus the fused layers of the batch ``data`` last made.

    Exposes what ``evaluate`` and ``distill_loss`` read: config, tables, dtype, head_features."""

    def __init__(self, model: CloverModel, fusion: LayerFusion | None, data: SignalBatches):
        super().__init__()
        self.model, self.fusion, self.data = model, fusion, data
        self.config, self.tables = model.config, model.tables

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def head_features(self, hidden: torch.Tensor, head_input_ids: torch.Tensor) -> torch.Tensor:
        if self.fusion is not None:
            hidden = hidden.float() + self.fusion(self.data.layers)  # (B, T, D)
        return self.model.head_features(hidden, head_input_ids)


def build_variant(cfg: TrainConfig, ctx: SimpleNamespace, layers: list[int]) -> TrainLoop:
    """The trainer's loop over a fresh network (seeded), the fusion when ``layers``, AdamW and
    schedule; its ``train_step`` is what `vllm-clover train` runs."""
    model = build_model(cfg, ctx.prepared, CPU)  # seeds cfg.seed itself
    eps = model.config.rms_norm_eps
    fusion = LayerFusion(len(layers), model.config.hidden_size, eps) if layers else None
    groups = parameter_groups(model, cfg)
    if fusion is not None:
        groups.append({"params": list(fusion.parameters()), "lr": cfg.lr})
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
    scheduler = warmup_cosine(optimizer, ctx.plan, cfg.warmup_fraction)
    net = FusedHeads(model, fusion, ctx.train_data)
    data = SimpleNamespace(train=ctx.train, batch=ctx.train_data.batch)  # Prepared's part
    plan, budget = ctx.plan, TimeBudget(None, time.monotonic())
    return TrainLoop(
        cfg, init_runtime("cpu"), data, net, optimizer, scheduler, plan, len(plan), budget
    )


def train_variant(cfg: TrainConfig, ctx: SimpleNamespace, layers: list[int]) -> dict:
    """Train one variant over ``ctx.plan`` and score it on ``ctx.eval_seqs`` as eval-heads does."""
    loop = build_variant(cfg, ctx, layers)
    started = time.monotonic()
    for step in range(len(ctx.plan)):
        loop.train_step(step)
        if step % 25 == 0:
            print(f"  step {step}/{len(ctx.plan)}", flush=True)
    seconds = time.monotonic() - started
    tokens = sum(len(ctx.train[j]) for ids in ctx.plan for j in ids)
    net = loop.model.float()
    net.data = ctx.eval_data
    result = evaluate(net, ctx.eval_data, ctx.eval_seqs, 8, CPU).summary()
    norms = [] if net.fusion is None else [p.weight.norm().item() for p in net.fusion.projs]
    gate = net.model.adapter.gate
    return {
        "layers": layers,
        "tokens": tokens,
        "steps": len(ctx.plan),
        "train_seconds": round(seconds, 1),
        "fusion_weight_norms": norms,
        "gate_mean": None if gate is None else gate.mean().item(),
        **result,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True)
    p.add_argument("--max-samples", type=int, default=1500)
    p.add_argument("--eval-data", required=True, help="held-out answers, scored whole")
    p.add_argument("--max-seq-len", type=int, default=576)
    p.add_argument("--max-tokens", type=int, default=400_000, help="0: the whole plan")
    p.add_argument("--variants", nargs="+", default=["none", "2,15,27"])
    p.add_argument("--teacher-batch-tokens", type=int, default=8192)
    p.add_argument("--json", default=None)
    return p.parse_args()


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The law's settings (docs/heads.md, "The law on the target's own answers")."""
    return TrainConfig(
        target=args.target, data=args.data, max_samples=args.max_samples,
        max_seq_len=args.max_seq_len, eval_fraction=0.02, dtype="bfloat16",
        draft_vocab_size=8192, num_heads=4, batch_size=8, seed=0, epochs=2, clover2=True,
        augmenting_gate=True, max_tokens=args.max_tokens or None, out="unused",
    )  # fmt: skip


def signals_for(args: argparse.Namespace, cfg: TrainConfig, layers: list[int]) -> SimpleNamespace:
    """Training split, step plan, draft vocabulary, and both splits' teacher signals."""
    teacher = load_teacher(args.target, CPU, torch.bfloat16)
    conversations = load_conversations(args.data, args.max_samples)
    seqs = tokenize_all(teacher.tokenizer, conversations, args.max_seq_len, args.data)
    train, _ = split_train_eval(seqs, cfg.eval_fraction, cfg.seed)
    plan = plan_steps([len(s) for s in train], cfg.batch_size, cfg.epochs, cfg.seed, cfg.max_tokens)
    used = [train[j] for j in sorted({j for step in plan for j in step})]
    draft_ids = draft_vocab_from_counts(token_counts(train, teacher.lm_head.shape[0]), 8192)
    started = time.monotonic()
    train_signals = teacher_signals(teacher, used, layers, args.teacher_batch_tokens)
    seconds = time.monotonic() - started
    print(f"teacher: {sum(len(s) for s in used)} tokens in {seconds:.0f} s", flush=True)
    teacher.model.float()  # eval-heads scores on a float32 teacher
    held = load_conversations(args.eval_data, None)
    eval_seqs = tokenize_all(teacher.tokenizer, held, args.max_seq_len, args.eval_data)
    return SimpleNamespace(
        prepared=SimpleNamespace(teacher=teacher, draft_vocab_ids=draft_ids),
        train=train, plan=plan, eval_seqs=eval_seqs, train_signals=train_signals,
        eval_signals=teacher_signals(teacher, eval_seqs, layers, args.teacher_batch_tokens),
    )  # fmt: skip


def select(signals: dict[str, Signal], pick: list[int]) -> dict[str, Signal]:
    """The same signals with only the layers at positions ``pick`` of the stack."""
    return {k: Signal(s.hidden, s.top1, s.layers[:, pick]) for k, s in signals.items()}


def main() -> None:
    args = parse_args()
    variants = [[] if v == "none" else [int(x) for x in v.split(",")] for v in args.variants]
    layers = sorted({j for v in variants for j in v})
    cfg = train_config(args)
    ctx = signals_for(args, cfg, layers)
    results = []
    for v in variants:
        pick = [layers.index(j) for j in v]
        ctx.train_data = SignalBatches(select(ctx.train_signals, pick))
        ctx.eval_data = SignalBatches(select(ctx.eval_signals, pick))
        print(f"variant {v or 'none'}", flush=True)
        r = train_variant(cfg, ctx, v)
        results.append(r)
        print(f"  tau {r['tau']:.3f}  h0 top1 {r['top1'][0]:.3f}  ({r['train_seconds']} s)")
    if args.json:
        keys = ("target", "data", "max_samples", "eval_data", "max_seq_len", "max_tokens")
        settings = {k: getattr(args, k) for k in keys}
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
