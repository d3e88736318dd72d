"""Loss indexing against a naive per-position reference, chain acceptance, LR schedule."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vllm_clover.modeling import CloverConfig, CloverHeads, shift_tokens_for_heads
from vllm_clover.training.data import Batch
from vllm_clover.training.evaluate import chain_acceptance
from vllm_clover.training.loss import distill_loss, graded_counts, graded_positions, head_weights
from vllm_clover.training.trainer import lr_factor

pytestmark = pytest.mark.unit

D, V, K = 16, 50, 3


def random_heads(draft_vocab_size: int | None = None) -> tuple[CloverHeads, torch.Tensor]:
    cfg = CloverConfig(hidden_size=D, vocab_size=V, num_heads=K, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=24, decoder_num_heads=4,
                       draft_vocab_size=draft_vocab_size)
    torch.manual_seed(0)
    heads = CloverHeads(cfg)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    lm_head = torch.randn(V, D)
    if draft_vocab_size:
        heads.set_draft_vocab(torch.randperm(V)[:draft_vocab_size].sort().values)
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


def naive_loss(heads: CloverHeads, lm_head: torch.Tensor, batch: Batch, weights, lam: float,
               soft: bool = True):
    """Straight from the definitions, one (b, t, i) at a time."""
    tokens = shift_tokens_for_heads(batch.input_ids, K, batch.attention_mask)
    z_all = heads.head_features(batch.hidden, tokens.input_ids)  # (B, T, K, D)
    rows = heads.vocab_weight()
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
                    j = int(heads.target_to_draft(batch.input_ids[b, label]))
                    p[j] = 1.0 if j >= 0 else 0.0
                log_q = F.log_softmax(rows @ z_all[b, t, i], -1)
                hl = F.smooth_l1_loss(z_all[b, t, i], batch.hidden[b, t + 1 + i])
                total[i] = total[i] + (-(p * log_q).sum() + lam * hl)
                counts[i] += 1
    return sum(weights[i] * total[i] / counts[i] for i in range(K)), counts


@pytest.mark.parametrize("draft_vocab_size, lam, soft", [
    (None, 0.0, True), (20, 0.0, True), (None, 10.0, True), (None, 0.0, False), (20, 0.0, False)])
def test_loss_matches_naive_reference(draft_vocab_size: int | None, lam: float,
                                      soft: bool) -> None:
    heads, lm_head = random_heads(draft_vocab_size)
    batch = random_batch(lm_head)
    weights = head_weights(K, 0.8)
    expected, counts = naive_loss(heads, lm_head, batch, weights, lam, soft)
    tokens, valid = graded_positions(batch, K)
    assert graded_counts(batch, K).tolist() == counts
    features = heads.head_features(batch.hidden, tokens.input_ids)
    loss, stats, preds = distill_loss(heads, features, batch, valid, weights,
                                      graded_counts(batch, K), lam, soft)
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
    shifted = torch.stack([F.pad(batch.hidden[:, 1 + i:], (0, 0, 0, 1 + i)) for i in range(K)],
                          dim=2)  # (B, T, K, D): H_{t+1+i}
    ones = torch.ones(K)
    _, stats, _ = distill_loss(heads, shifted, batch, valid, ones, ones, 0.0)
    assert stats.top1.tolist() == stats.count.tolist() == stats.top5.tolist()


def chain_batch(x: list[int], top1: list[int]) -> Batch:
    t = len(x)
    return Batch(torch.tensor([x]), torch.ones(1, t, dtype=torch.bool),
                 torch.ones(1, t, dtype=torch.bool), torch.zeros(1, t, D), torch.tensor([top1]))


def test_chain_acceptance_worked_example() -> None:
    """K = 3, T = 8, greedy self-distilled data (target argmax at t is x_{t+1})."""
    x = [5, 6, 7, 8, 9, 10, 11, 12]
    batch = chain_batch(x, x[1:] + [0])
    tokens, valid = graded_positions(batch, K)
    perfect = torch.where(valid, tokens.target_ids, -1)  # every draft = x_{t+2+i}
    # starts t = 0..5; accepted 3,3,3,3 (t <= 3), 2 (t = 4), 1 (t = 5) -> 15
    assert chain_acceptance(perfect, tokens, valid, batch) == (6, 15)
    wrong = perfect.clone()
    wrong[0, 0, 1] = 0  # head 1 wrong at t = 0: the chain stops after 1 there
    assert chain_acceptance(wrong, tokens, valid, batch) == (6, 13)
    disagree = chain_batch(x, x[1:3] + [99] + x[4:] + [0])  # target argmax at t=2 is not x_3
    # t = 2 is no start (t0 != x_3); a draft of x_3 is rejected (t = 1 head 0, t = 0 head 1)
    assert chain_acceptance(perfect, tokens, valid, disagree) == (5, 1 + 0 + 3 + 2 + 1)


def test_lr_schedule_warmup_then_cosine() -> None:
    values = [lr_factor(s, 10, 2) for s in range(10)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert math.isclose(values[6], 0.5) and values[9] < 0.05
    assert all(a >= b for a, b in zip(values[1:], values[2:], strict=False))
