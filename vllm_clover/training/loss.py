"""Distillation loss of the Clover heads against the target's own distribution.

Head i at position t reads x_{t+1+i} and guesses x_{t+2+i}, graded where that token is an
assistant token; its soft label is softmax(W_lm H_{t+1+i}), recomputed from the cached hidden
state (no logits are cached). L = sum_i w_i (CE_i + lambda HL_i) / n_i, with n_i counted over
the whole optimizer step. How it works: docs/design/training-internals.md, "Loss".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_clover.modeling import CloverModel, HeadTokens, shift_tokens_for_heads
from vllm_clover.training.data import Batch


def head_weights(num_heads: int, base: float) -> torch.Tensor:
    """(K,) loss weight of each head: base**i. Example: (3, 0.8) -> [1.0, 0.8, 0.64]."""
    return base ** torch.arange(num_heads, dtype=torch.float32)


def graded_positions(batch: Batch, num_heads: int) -> tuple[HeadTokens, torch.Tensor]:
    """Teacher-forcing tokens and which (b, t, i) are graded: (B, T, K) bool."""
    tokens = shift_tokens_for_heads(batch.input_ids, num_heads, batch.attention_mask)
    label_is_assistant = shift_tokens_for_heads(batch.loss_mask.long(), num_heads).target_ids
    return tokens, tokens.mask & label_is_assistant.bool()  # (B, T, K)


@dataclass
class HeadStats:
    """Per-head sums over graded positions; all (K,) float64 so they can be all-reduced."""

    ce: torch.Tensor
    hidden: torch.Tensor
    count: torch.Tensor
    top1: torch.Tensor  # head's argmax == target's argmax at t+1+i (full vocabulary)
    top5: torch.Tensor  # target's argmax among the head's 5 best

    @classmethod
    def zeros(cls, num_heads: int, device: torch.device | str = "cpu") -> HeadStats:
        return cls(*(torch.zeros(num_heads, dtype=torch.float64, device=device) for _ in range(5)))

    def add_(self, other: HeadStats) -> HeadStats:
        for name in ("ce", "hidden", "count", "top1", "top5"):
            getattr(self, name).add_(getattr(other, name).to(getattr(self, name).device))
        return self

    def stacked(self) -> torch.Tensor:
        return torch.stack([self.ce, self.hidden, self.count, self.top1, self.top5])  # (5, K)

    @classmethod
    def from_stacked(cls, stacked: torch.Tensor) -> HeadStats:
        return cls(*stacked.unbind(0))

    def means(self) -> dict[str, list[float]]:
        n = self.count.clamp(min=1)
        return {
            name: (getattr(self, name) / n).tolist() for name in ("ce", "hidden", "top1", "top5")
        }


def target_distributions(
    batch: Batch, valid: torch.Tensor, vocab_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution at every position some head is graded against, computed
    once (position s serves head i at t = s-1-i): (rows (B, T) int64, the row of position
    (b, s) in probs or -1; probs (P, N) = softmax(W_lm[draft] @ H_s))."""
    b_size, t_size, k = valid.shape
    need = torch.zeros(b_size, t_size, dtype=torch.bool, device=valid.device)  # (B, T)
    for i in range(k):
        need[:, 1 + i :] |= valid[:, : t_size - 1 - i, i]  # head i at t needs s = t+1+i
    b, s = need.nonzero(as_tuple=True)  # (P,), (P,)
    rows = torch.full((b_size, t_size), -1, dtype=torch.long, device=valid.device)
    rows[b, s] = torch.arange(b.numel(), device=valid.device)
    d = vocab_weight.shape[1]  # H is the first D columns of a signal with target layers
    logits = F.linear(batch.hidden[b, s, :d].float(), vocab_weight.float())  # (P, N)
    return rows, F.softmax(logits.float(), dim=-1)


def top_k_renormalised(probs: torch.Tensor, k: int) -> torch.Tensor:
    """(P, N) distributions cut to their k likeliest entries and renormalised."""
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    kept = top.values / top.values.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, top.indices, kept)


# (z (M, D), vocabulary rows W (N, D), p_target (M, N)) -> (CE, top log q (M, 5), top rows (M, 5))
HeadCrossEntropy = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]
TOP_K = 5  # the stats' top-5 accuracy


def head_cross_entropy(
    z: torch.Tensor, weight: torch.Tensor, p_target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One head's soft-label cross-entropy sum_m -sum_v p(v) log q(v), q = softmax(z W^T), and
    its TOP_K best rows (log q and row index, for the stats; no gradient).

    z (M, D), W (N, D), p_target (M, N). ``--compile-heads`` compiles it: the (M, N) log q is
    a training step's largest tensor."""
    log_q = F.log_softmax(F.linear(z, weight).float(), dim=-1)  # (M, N)
    top = log_q.detach().topk(min(TOP_K, log_q.shape[-1]), dim=-1)
    return -(p_target * log_q).sum(), top.values, top.indices


def _one_hot_labels(tables, tokens: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """(M, N) one-hot rows of the data's next tokens (M,) in the draft vocabulary; a row of
    zeros for a token outside it (Medusa-1's hard labels)."""
    label = tables.target_to_draft(tokens)  # (M,), -1: not in the draft vocabulary
    one_hot = F.one_hot(label.clamp(min=0), draft_vocab_size).float()  # (M, N)
    return one_hot * (label >= 0).unsqueeze(-1)


def distill_loss(
    model: CloverModel,
    features: torch.Tensor,
    batch: Batch,
    valid: torch.Tensor,
    weights: torch.Tensor,
    normaliser: torch.Tensor,
    hidden_loss_weight: float,
    soft_labels: bool = True,
    cross_entropy: HeadCrossEntropy | None = None,
    label_top_k: int | None = None,
) -> tuple[torch.Tensor, HeadStats, torch.Tensor, torch.Tensor]:
    """Loss of one micro-batch (module docstring), its stats and the head predictions.

    features (B, T, K, D) from ``model.head_features``; valid (B, T, K); weights, normaliser (K,).
    ``soft_labels=False``: the data's one-hot tokens (Medusa-1). Returns (scalar loss, HeadStats,
    predictions (B, T, K) target ids or -1, their head probabilities (B, T, K) float32 or 0)."""
    cross_entropy = cross_entropy or head_cross_entropy
    k = features.shape[2]
    tables = model.tables
    w = tables.vocab_weight(model.dtype)  # (N, D)
    stats = HeadStats.zeros(k, features.device)
    preds = torch.full(valid.shape, -1, dtype=torch.long, device=features.device)  # (B, T, K)
    confidence = torch.zeros(valid.shape, device=features.device)  # (B, T, K)
    loss = features.float().sum() * 0.0  # every parameter gets a gradient (DDP needs it)
    with torch.no_grad():
        rows, probs = target_distributions(batch, valid if soft_labels else valid[..., :0], w)
        if label_top_k:
            probs = top_k_renormalised(probs, label_top_k)
    for i in range(k):
        b, t = valid[..., i].nonzero(as_tuple=True)  # (M,), (M,)
        if b.numel() == 0:
            continue
        z = features[b, t, i]  # (M, D) head feature at t
        h = batch.hidden[b, t + 1 + i, : z.shape[-1]].float()  # (M, D) target H_{t+1+i}
        if soft_labels:
            p_target = probs[rows[b, t + 1 + i]]  # (M, N) target distribution for x_{t+2+i}
        else:
            p_target = _one_hot_labels(tables, batch.input_ids[b, t + 2 + i], w.shape[0])
        ce, top_log_q, top_rows = cross_entropy(z.to(w.dtype), w, p_target)
        hl = F.smooth_l1_loss(z.float(), h, reduction="none").mean(-1).sum()
        loss = loss + weights[i] * (ce + hidden_loss_weight * hl) / normaliser[i].clamp(min=1)
        with torch.no_grad():
            want = batch.target_top1[b, t + 1 + i]  # (M,) target argmax for x_{t+2+i}
            best = tables.draft_to_target(top_rows)  # (M, 5)
            grade_head(stats, i, best, want, ce, hl)
            preds[b, t, i], confidence[b, t, i] = best[:, 0], top_log_q[:, 0].exp()
    return loss, stats, preds, confidence


def grade_head(
    stats: HeadStats,
    i: int,
    best: torch.Tensor,
    want: torch.Tensor,
    ce: torch.Tensor,
    hidden: torch.Tensor,
) -> None:
    """Records head i's losses and how often its top-1 and top-5 (``best`` (M, 5), target
    ids) hold the target's argmax ``want`` (M,) on its M graded positions."""
    stats.ce[i], stats.hidden[i], stats.count[i] = ce.detach(), hidden.detach(), want.numel()
    stats.top1[i] = (best[:, 0] == want).sum()
    stats.top5[i] = (best == want[:, None]).any(-1).sum()
