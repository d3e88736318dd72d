"""The EAGLE-3 loss and chain figures against their definitions, on a small drafter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_eagle3_network import D, V, drafter

from vllm_clover.eagle3.loss import eagle3_loss
from vllm_clover.training.data import Batch
from vllm_clover.training.loss import graded_positions

pytestmark = pytest.mark.unit


def batch(lm_head: torch.Tensor) -> Batch:
    gen = torch.Generator().manual_seed(5)
    attention = torch.arange(8)[None] < torch.tensor([[8], [6]])  # (2, 8)
    ids = torch.randint(0, V, (2, 8), generator=gen) * attention
    loss_mask = attention & (torch.arange(8)[None] >= 2)
    hidden = torch.randn(2, 8, 4 * D, generator=gen)
    return Batch(ids, attention, loss_mask, hidden, (hidden[..., :D] @ lm_head.T).argmax(-1))


def test_loss_and_chains_match_their_definitions() -> None:
    model = drafter()
    lm_head = torch.randn(V, D, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        model.lm_head.weight.copy_(lm_head[model.draft_ids])
    b = batch(lm_head)
    valid = graded_positions(b, 3)[1]
    assert valid[1, 3, 0] and not valid[1, 4, 0] and not valid[1, 3, 1]  # x_{t+2+k} must exist
    loss, stats = eagle3_loss(model, b, decay=0.5)
    states = model.unrolled(b.hidden[..., D:], b.input_ids, b.attention_mask)
    expected, accepted, chains = 0.0, 0, 0
    for k, s in enumerate(states):
        bi, ti = valid[..., k].nonzero(as_tuple=True)
        p = F.softmax(b.hidden[bi, ti + 1 + k, :D] @ model.lm_head.weight.T, dim=-1)
        log_q = F.log_softmax(model.logits(s[bi, ti]), dim=-1)
        expected += 0.5**k * -(p * log_q).sum() / len(bi)
    for r, t in zip(*valid[..., 0].nonzero(as_tuple=True), strict=True):
        chains += 1
        for k, s in enumerate(states):
            guess = model.draft_ids[model.logits(s[r, t]).argmax()]
            if not valid[r, t, k] or guess != b.target_top1[r, t + 1 + k]:
                break
            accepted += 1
    torch.testing.assert_close(loss, expected)
    assert (stats.chains, stats.accepted) == (chains, accepted)
    assert stats.count.tolist() == valid.sum(dim=(0, 1)).tolist() and not stats.hidden.any()
