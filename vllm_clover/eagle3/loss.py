"""What the EAGLE-3 drafter is trained and judged against: the target's own distribution.

Step k at t guesses x_{t+2+k}, graded against softmax(W_lm[draft] @ H_{t+1+k}) where x_{t+2+k}
is an assistant token; loss ``sum_k decay^k CE_k / n_k``. ``tau = 1 + E[accepted]`` of the
teacher-forced greedy chains is what vLLM would count at T = 0 with K = ttt_steps.
How it works: docs/design/network.md, "The EAGLE-3 loss and its figures: eagle3/loss.py".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_clover.eagle3.network import Eagle3Drafter
from vllm_clover.training.data import Batch
from vllm_clover.training.loss import (
    HeadStats,
    grade_head,
    graded_positions,
    target_distributions,
)


@dataclass
class StepStats(HeadStats):
    """HeadStats per TTT step (its hidden-state sums stay 0), and the chains' accepted
    drafts."""

    chains: int = 0  # positions where step 0 is graded
    accepted: int = 0  # sum over them of the greedy chain's accepted drafts

    def add_(self, other: StepStats) -> StepStats:
        super().add_(other)
        self.chains += other.chains
        self.accepted += other.accepted
        return self

    def summary(self) -> dict[str, object]:
        """The figures `eval-heads` prints for Clover heads, per TTT step."""
        n = self.count.clamp(min=1)
        accepted = self.accepted / max(self.chains, 1)
        return {
            "soft_ce": (self.ce / n).tolist(),
            "top1": (self.top1 / n).tolist(),
            "top5": (self.top5 / n).tolist(),
            "positions": self.count.tolist(),
            "chain_starts": self.chains,
            "expected_accepted": accepted,
            "tau": 1 + accepted,
        }


def eagle3_loss(
    drafter: Eagle3Drafter, batch: Batch, decay: float
) -> tuple[torch.Tensor, StepStats]:
    """The batch's loss (to backward) and its stats (see the module docstring)."""
    d, steps = drafter.config.hidden_size, drafter.config.ttt_steps
    valid = graded_positions(batch, steps)[1]  # (B, T, K): x_{t+2+k} exists, an assistant's
    states = drafter.unrolled(batch.hidden[..., d:], batch.input_ids, batch.attention_mask)
    with torch.no_grad():  # step k at t reads H_{t+1+k}, as Clover's head k does: once each
        rows, probs = target_distributions(batch, valid, drafter.lm_head.weight)
    stats, loss = StepStats.zeros(steps), states[0].float().sum() * 0.0
    hits = torch.zeros(valid.shape, dtype=torch.bool)
    for k, s in enumerate(states):
        b, t = valid[..., k].nonzero(as_tuple=True)
        if b.numel() == 0:
            continue
        p = probs[rows[b, t + 1 + k]]  # (M, N) the target's distribution for x_{t+2+k}
        log_q = F.log_softmax(drafter.logits(s[b, t]).float(), dim=-1)
        ce = -(p * log_q).sum()
        loss = loss + decay**k * ce / b.numel()
        with torch.no_grad():
            best = drafter.draft_ids[log_q.topk(min(5, log_q.shape[-1])).indices.cpu()]  # (M, 5)
            want = batch.target_top1[b, t + 1 + k].cpu()
            hits[b.cpu(), t.cpu(), k] = best[:, 0] == want
            grade_head(stats, k, best, want, ce, ce.new_zeros(()))
    first = valid[..., 0]
    chain = torch.cumprod((hits & valid).int(), dim=-1).sum(-1)  # (B, T) accepted drafts
    stats.chains, stats.accepted = int(first.sum()), int(chain[first].sum())
    return loss, stats


@torch.no_grad()
def evaluate(drafter: Eagle3Drafter, batches, device) -> StepStats:
    """Held-out figures over ``batches`` (an iterable of Batch, their signal [H | the
    drafter's target layers])."""
    stats = StepStats.zeros(drafter.config.ttt_steps)
    for batch in batches:
        stats.add_(eagle3_loss(drafter, batch.to(device), 1.0)[1])
    return stats
