"""The distillation loss against a naive per-position reference, and its accuracy stats."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_config
from vllm_clover.modeling import CloverModel, shift_tokens_for_heads
from vllm_clover.training.data import Batch
from vllm_clover.training.loss import (
    distill_loss,
    graded_positions,
    head_weights,
    top_k_renormalised,
)

pytestmark = pytest.mark.unit

D, V, K = 16, 50, 3


def random_heads(draft_vocab_size: int | None = None) -> tuple[CloverModel, torch.Tensor]:
    cfg = tiny_config(
        hidden_size=D, vocab_size=V, intermediate_size=24, draft_vocab_size=draft_vocab_size
    )
    torch.manual_seed(0)
    heads = CloverModel(cfg)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    lm_head = torch.randn(V, D)
    if draft_vocab_size:
        heads.tables.set_draft_vocab(torch.randperm(V)[:draft_vocab_size].sort().values)
    heads.attach_target(lm_head)
    return heads, lm_head


def random_batch(lm_head: torch.Tensor, lengths=(9, 6)) -> Batch:
    b, t = len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(1)
    attention = torch.arange(t)[None] < torch.tensor(lengths)[:, None]  # (B, T)
    ids = torch.randint(0, V, (b, t), generator=gen) * attention
    loss_mask = (torch.rand(b, t, generator=gen) < 0.7) & attention
    hidden = torch.randn(b, t, D, generator=gen) * attention[..., None]
    return Batch(ids, attention, loss_mask, hidden, (hidden @ lm_head.T).argmax(-1))


def naive_loss(
    heads: CloverModel, lm_head: torch.Tensor, batch: Batch, weights, lam: float, soft: bool = True
):
    """Straight from the definitions, one (b, t, i) at a time."""
    tokens = shift_tokens_for_heads(batch.input_ids, K, batch.attention_mask)
    z_all = heads.head_features(batch.hidden, tokens.input_ids)  # (B, T, K, D)
    rows = heads.tables.vocab_weight(heads.dtype)
    total, counts = [0.0] * K, [0] * K
    for b in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[b].sum())
        for t in range(n):
            for i in range(K):
                label = t + 2 + i  # head i at t guesses x_{t+2+i} ...
                if label >= n or not batch.loss_mask[b, label]:
                    continue
                p = F.softmax(rows @ batch.hidden[b, t + 1 + i], -1)  # ... from H_{t+1+i}
                if not soft:  # ablation: the data token itself, in draft-vocab coordinates
                    p = torch.zeros_like(p)
                    j = int(heads.tables.target_to_draft(batch.input_ids[b, label]))
                    p[j] = 1.0 if j >= 0 else 0.0
                log_q = F.log_softmax(rows @ z_all[b, t, i], -1)
                hl = F.smooth_l1_loss(z_all[b, t, i], batch.hidden[b, t + 1 + i])
                total[i] = total[i] + (-(p * log_q).sum() + lam * hl)
                counts[i] += 1
    return sum(weights[i] * total[i] / counts[i] for i in range(K)), counts


@pytest.mark.parametrize(
    "draft_vocab_size, lam, soft",
    [(None, 0.0, True), (20, 0.0, True), (None, 10.0, True), (None, 0.0, False), (20, 0.0, False)],
)
def test_loss_matches_naive_reference(draft_vocab_size: int | None, lam: float, soft: bool) -> None:
    heads, lm_head = random_heads(draft_vocab_size)
    batch = random_batch(lm_head)
    weights = head_weights(K, 0.8)
    expected, counts = naive_loss(heads, lm_head, batch, weights, lam, soft)
    tokens, valid = graded_positions(batch, K)
    normaliser = valid.sum(dim=(0, 1)).float()  # (K,) graded positions per head
    assert normaliser.tolist() == counts
    features = heads.head_features(batch.hidden, tokens.input_ids)
    loss, stats, preds, _ = distill_loss(
        heads, features, batch, valid, weights, normaliser, lam, soft
    )
    torch.testing.assert_close(loss, expected.float(), rtol=1e-5, atol=1e-5)
    assert stats.count.tolist() == counts
    assert ((preds >= 0) == valid).all()
    loss.backward()  # and it has a gradient for every trainable parameter
    assert all(p.grad is not None for p in heads.parameters())


def test_head_weights_decay() -> None:
    torch.testing.assert_close(head_weights(3, 0.8), torch.tensor([1.0, 0.8, 0.64]))


def test_top1_accuracy_is_measured_against_the_target_argmax() -> None:
    """Heads that output exactly H_{t+1+i} (Medusa, fed the shifted state) are 100% right."""
    heads, lm_head = random_heads()
    batch = random_batch(lm_head)
    tokens, valid = graded_positions(batch, K)
    shifted = torch.stack(
        [F.pad(batch.hidden[:, 1 + i :], (0, 0, 0, 1 + i)) for i in range(K)], dim=2
    )  # (B, T, K, D): H_{t+1+i}
    ones = torch.ones(K)
    _, stats, _, _ = distill_loss(heads, shifted, batch, valid, ones, ones, 0.0)
    assert stats.top1.tolist() == stats.count.tolist() == stats.top5.tolist()


def test_top_k_labels_keep_the_likeliest_tokens_and_top_1_is_the_argmax() -> None:
    """--label-top-k: the labels are the target's k likeliest tokens renormalised; at k = 1
    the loss is the hard-label loss against the target's own argmax, and it differs from the
    full soft-label loss."""
    cut = top_k_renormalised(torch.tensor([[0.2, 0.5, 0.3]]), 2)
    torch.testing.assert_close(cut, torch.tensor([[0.0, 0.625, 0.375]]))
    heads, lm_head = random_heads()
    batch = random_batch(lm_head)
    tokens, valid = graded_positions(batch, K)
    normaliser, weights = valid.sum(dim=(0, 1)).float(), head_weights(K, 0.8)
    features = heads.head_features(batch.hidden, tokens.input_ids)
    args = (heads, features, batch, valid, weights, normaliser, 0.0)
    top1, *_ = distill_loss(*args, label_top_k=1)
    labels = batch.target_top1.roll(1, dims=1)  # x_{s+1} := the target's argmax at s
    argmax = Batch(labels, batch.attention_mask, batch.loss_mask, batch.hidden, batch.target_top1)
    hard, *_ = distill_loss(heads, features, argmax, valid, weights, normaliser, 0.0, False)
    torch.testing.assert_close(top1, hard)
    soft, *_ = distill_loss(*args)
    assert not torch.isclose(top1, soft)
