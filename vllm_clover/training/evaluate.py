"""Offline head quality: per-head top-1/top-5 accuracy and the implied greedy-chain acceptance,
graded against the target's own argmax (what vLLM verifies at T = 0): ``tau`` over a chain
started at every position decoding could be in, ``step_tau`` over the steps it takes.
How it works: docs/design/training-internals.md, "Offline evaluation".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_clover.modeling import CloverModel, HeadTokens, load_clover, shift_tokens_for_heads
from vllm_clover.modeling.checkpoint import (
    CloverCheckpointError,
    read_config_json,
    set_config_field,
)
from vllm_clover.modeling.layer_fusion import signal_columns
from vllm_clover.training.calibrate import calibrate_confidence, chain_value
from vllm_clover.training.config import EvalConfig, TrainingError
from vllm_clover.training.data import Batch, TokenizedSequence
from vllm_clover.training.loss import HeadStats, distill_loss, graded_positions
from vllm_clover.training.pipeline import DataSpec, Prepared, prepare
from vllm_clover.training.runtime import init_runtime


def chain_hits(
    preds: torch.Tensor, tokens: HeadTokens, valid: torch.Tensor, batch: Batch
) -> tuple[torch.Tensor, torch.Tensor]:
    """(start positions (B, T) bool, draft i equals the target's argmax there (B, T, K) bool).

    preds: (B, T, K) head argmax as target ids; tokens/valid from ``graded_positions``.
    A start's accepted drafts are its leading run of hits (``ok.cumprod``)."""
    k, mask = preds.shape[-1], batch.attention_mask  # the argmax at t+1+i, a head's input's
    top1_next = shift_tokens_for_heads(batch.target_top1, k, mask).input_ids  # (B, T, K)
    ok = valid & (preds == top1_next) & (top1_next == tokens.target_ids)  # (B, T, K)
    start = valid[..., 0] & (tokens.input_ids[..., 0] == batch.target_top1)  # (B, T)
    return start, ok


def decode_steps(start: torch.Tensor, ok: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
    """The chain steps greedy speculative decoding takes through one sequence: (S, K) hits.

    start (T,) and ok (T, K) are one row of ``chain_hits``; domain (T,) bool marks where a
    step can begin. A step at t accepts the leading run a of ok[t] (0 where t is no start)
    and the next begins at t + a + 1 (worked example: docs/design/training-internals.md)."""
    accepted = (ok.long().cumprod(dim=-1).sum(dim=-1) * start).tolist()  # (T,)
    steps, next_start = [], 0
    for t in domain.nonzero().flatten().tolist():
        if t >= next_start:
            steps.append(t)
            next_start = t + accepted[t] + 1
    return (ok & start[:, None])[steps]  # (S, K)


@dataclass
class EvalResult:
    stats: HeadStats
    hits: torch.Tensor  # (S, K) bool: draft i right at each of the S chain starts
    confidence: torch.Tensor  # (S, K) float32: the head's probability of that draft
    steps: torch.Tensor  # (W, K) bool: draft i right at each of the W decode steps

    @property
    def starts(self) -> int:
        return self.hits.shape[0]

    @property
    def accepted(self) -> int:
        return int(self.hits.long().cumprod(dim=-1).sum())

    def summary(self) -> dict[str, object]:
        means = self.stats.means()
        expected = self.accepted / max(self.starts, 1)
        walked = self.steps.long().cumprod(dim=-1)  # (W, K): draft i accepted at that step
        per_step = walked.float().mean(dim=0) if len(walked) else torch.zeros(walked.shape[1])
        return {
            "top1": means["top1"],
            "top5": means["top5"],
            "soft_ce": means["ce"],
            "positions": self.stats.count.tolist(),
            "chain_starts": self.starts,
            "expected_accepted": expected,
            "tau": 1.0 + expected,
            "decode_steps": len(walked),
            "step_acceptance": per_step.tolist(),
            "step_tau": 1.0 + float(per_step.sum()),
        }


@torch.no_grad()
def evaluate(
    model: CloverModel,
    prepared: Prepared,
    sequences: Sequence[TokenizedSequence],
    batch_size: int,
    device: torch.device,
) -> EvalResult:
    """Teacher-forced metrics of ``model`` over ``sequences`` (module docstring)."""
    k = model.config.num_heads
    was_training = model.training
    model.eval()
    stats, hits, confidence, steps = HeadStats.zeros(k), [], [], []
    ones = torch.ones(k, device=device)
    want = model.config.target_layers or []  # eval-heads may prepare more layers than these
    columns = signal_columns(prepared.target_layers, want, model.config.hidden_size)
    for i in range(0, len(sequences), batch_size):
        batch = prepared.batch(list(sequences[i : i + batch_size])).to(device)
        tokens, valid = graded_positions(batch, k)
        signal = batch.hidden if columns is None else batch.hidden[..., columns.to(device)]
        features = model.head_features(signal, tokens.input_ids)  # (B, T, K, D)
        _, batch_stats, preds, conf = distill_loss(model, features, batch, valid, ones, ones, 0.0)
        stats.add_(batch_stats)
        start, ok = chain_hits(preds, tokens, valid, batch)
        hits.append(ok[start].cpu())
        confidence.append(conf[start].cpu())
        t0_is_answer = torch.nn.functional.pad(batch.loss_mask[:, 1:], (0, 1))  # (B, T)
        domain = valid[..., 0] & t0_is_answer
        steps += [
            decode_steps(*row) for row in zip(start.cpu(), ok.cpu(), domain.cpu(), strict=True)
        ]
    model.train(was_training)
    empty = torch.zeros(0, k, dtype=torch.bool)
    return EvalResult(
        stats,
        torch.cat([empty, *hits]),
        torch.cat([empty.float(), *confidence]),
        torch.cat([empty, *steps]),
    )


def format_table(results: dict[str, dict[str, object]]) -> str:
    """Markdown table, one row per model: top-1/top-5 per head, E[accepted], tau (every
    start) and tau per decode step."""
    k = max(len(r["top1"]) for r in results.values())
    head = ["model", *[f"h{i} top1/top5" for i in range(k)], "E[accepted]", "tau", "step tau"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        cells = [f"{a:.3f}/{b:.3f}" for a, b in zip(r["top1"], r["top5"], strict=True)]
        cells += ["-"] * (k - len(cells))
        rows.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {r['expected_accepted']:.3f} | {r['tau']:.3f} | {r['step_tau']:.3f} |"
        )
    return "\n".join(rows)


def eval_heads(cfg: EvalConfig) -> dict[str, dict]:
    """Evaluate every checkpoint on the held-out split (the trainer's, given its data, seed,
    eval fraction and max length); print a table; return the metrics."""
    runtime = init_runtime(cfg.device)
    if runtime.distributed:
        raise TrainingError("eval-heads runs in one process; do not launch it with torchrun")
    everything = cfg.eval_fraction == 0
    spec = dataclasses.replace(DataSpec.from_config(cfg), target_layers=layers_read(cfg.heads))
    prepared = prepare(spec, runtime, getattr(torch, cfg.dtype), cache_train=everything)
    sequences = prepared.train if everything else prepared.eval
    teacher = prepared.teacher
    embed = None  # the target's input embedding, which an EAGLE-3 drafter reads
    if any(is_eagle3(path) for path in cfg.heads):
        embed = teacher.model.get_input_embeddings().weight.detach().float().cpu()
    teacher.release()
    results = {}
    for path in cfg.heads:
        if is_eagle3(path):  # an EAGLE-3 drafter (train-eagle3): its chain, per TTT step
            results[str(path)] = eval_eagle3(path, embed, prepared, sequences, cfg, runtime)
            continue
        try:
            model = load_clover(path, teacher.lm_head.to(runtime.device), dtype=torch.float32)
        except CloverCheckpointError as err:
            raise TrainingError(str(err)) from err
        result = evaluate(model, prepared, sequences, cfg.batch_size, runtime.device)
        results[str(path)] = result.summary()
        if cfg.draft_token_cost is not None:
            results[str(path)]["draft_confidence"] = calibrate(result, path, cfg)
    print(format_table(results))
    if cfg.draft_token_cost is not None:
        print(format_calibration(results, cfg.draft_token_cost))
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


def layers_read(heads: Sequence[str]) -> tuple[int, ...]:
    """Every target layer some of the checkpoints read (their union, sorted): the signal
    eval-heads prepares once; each model then reads its own columns of it."""
    try:
        configs = [read_config_json(path, model_type=None) for path in heads]
    except CloverCheckpointError as err:
        raise TrainingError(str(err)) from err
    read = [c.get("target_layers") or c.get("eagle_aux_hidden_state_layer_ids") for c in configs]
    return tuple(sorted({j for layers in read for j in layers or ()}))


def is_eagle3(path: str) -> bool:
    """Whether the folder holds an EAGLE-3 drafter in the speculators format."""
    return read_config_json(path, model_type=None).get("speculators_model_type") == "eagle3"


def eval_eagle3(path, embed, prepared, sequences, cfg: EvalConfig, runtime) -> dict:
    """An EAGLE-3 drafter's held-out figures (``eagle3/loss.py``), on its own columns of the
    prepared signal."""
    from vllm_clover.eagle3.checkpoint import load_eagle3
    from vllm_clover.eagle3.loss import evaluate as evaluate_eagle3

    drafter = load_eagle3(path, embed).to(runtime.device)
    d = drafter.config.hidden_size
    columns = signal_columns(prepared.target_layers, drafter.config.aux_layers, d)

    def batches():
        for i in range(0, len(sequences), cfg.batch_size):
            batch = prepared.batch(sequences[i : i + cfg.batch_size])
            if columns is not None:
                batch.hidden = batch.hidden[..., columns]
            yield batch

    summary = evaluate_eagle3(drafter, batches(), runtime.device).summary()
    return {**summary, "step_tau": float("nan")}  # chains only: no decode-step replay


def calibrate(result: EvalResult, path: str, cfg: EvalConfig) -> dict[str, object]:
    """Thresholds for ``cfg.draft_token_cost`` and what they change on the held-out chains;
    written into the checkpoint with ``--write-confidence``."""
    cost = cfg.draft_token_cost
    thresholds, tuned = calibrate_confidence(result.confidence, result.hits, cost)
    always = chain_value(result.confidence, result.hits, torch.zeros(len(thresholds)), cost)
    if cfg.write_confidence:
        try:
            set_config_field(path, "draft_confidence", thresholds)
        except CloverCheckpointError as err:
            raise TrainingError(str(err)) from err
    return {
        "cost": cost,
        "thresholds": thresholds,
        "written": cfg.write_confidence,
        "always": vars(always),
        "calibrated": vars(tuned),
    }


def format_calibration(results: dict[str, dict], cost: float) -> str:
    """Markdown table: thresholds, E[drafted] and E[accepted] without and with them."""
    rows = [
        f"| model | thresholds (cost {cost}) | E[drafted] | E[accepted] | value |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        c = r["draft_confidence"]
        a, t = c["always"], c["calibrated"]
        rows.append(
            f"| {name} | {c['thresholds']} | {a['drafted']:.2f} -> {t['drafted']:.2f} | "
            f"{a['accepted']:.3f} -> {t['accepted']:.3f} | {a['value']:.3f} -> {t['value']:.3f} |"
        )
    return "\n".join(rows)
