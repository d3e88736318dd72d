"""Drafts sampled from the heads' own distributions, for requests sampled at temperature > 0.

vLLM verifies a draft token x drawn from a draft distribution q against the target's p by
accepting it with probability min(1, p(x) / q(x)) and, on rejection, sampling from
max(p - q, 0) normalised: the output follows p exactly, whatever q is, provided x was drawn
from q. Greedy drafts are the case q = one-hot(argmax), accepted with probability p(x). A
head that spreads its mass like the target does is accepted far more often when its draft is
drawn from q: the expected acceptance is sum_x min(p(x), q(x)) = 1 - TV(p, q) instead of
p(argmax q) (measured: docs/history/benchmarks-2026-11.md, "Drawn drafts at T > 0").

``DraftSampler`` picks each head step's draft token per request and keeps the distributions
it drew from, which the rejection sampler needs:

- a request at temperature T > 0 draws from softmax(logits / T) over the draft vocabulary
  (the heads' logits, scaled like the target's; top-k and top-p are left out, as vLLM's
  EAGLE does: they lower acceptance, not correctness);
- a seeded request draws with its own generator (the one vLLM's rejection sampler then
  draws its uniforms from), so its output is reproduced wherever its drafts are;
- a greedy request (T = 0) takes the argmax, recorded as a one-hot row: verified exactly as
  a greedy draft is.

Worked example, draft vocabulary [2, 5, 9] of V = 10, two requests, one head step: logits
[[0, 0, ln 2], [3, 1, 0]], temperatures [1, 0] -> request 0 draws from q = [0.25, 0.25,
0.5] (draft rows 0, 1, 2 = target ids 2, 5, 9), request 1 takes row 0 (target id 2) with
q = [1, 0, 0]; ``target_probs`` scatters them to rows of V = 10: request 0 has 0.25 at ids 2
and 5, 0.5 at id 9, 0 elsewhere.
"""

from __future__ import annotations

import itertools

import torch


class DraftSampler:
    """Chooses draft tokens for one drafting call and records q (one row per head step).

    temperature: (M,) each request's sampling temperature (0: greedy: the argmax);
    generators: {row: torch.Generator} of the seeded requests (vLLM's
    ``SamplingMetadata.generators``), whose draws come from their own generator.
    """

    def __init__(
        self, temperature: torch.Tensor, generators: dict[int, torch.Generator] | None = None
    ) -> None:
        self.draw_rows = temperature > 0  # (M,)
        self.num_drawn = int(self.draw_rows.sum())  # requests that draw (the rest: argmax)
        self.temperature = torch.where(self.draw_rows, temperature, 1.0).float()  # (M,)
        self.generators = generators or {}
        self.steps: list[torch.Tensor] = []  # per head step: q over the draft vocab (M, N)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocab indices (M,) for one head step's logits (M, N); q recorded."""
        logits = logits.float()
        probs = (logits / self.temperature[:, None]).softmax(dim=-1)  # (M, N)
        drawn = inverse_cdf(probs, self.generators)  # (M,)
        if self.num_drawn == len(self.draw_rows):  # no one-hot rows to build
            self.steps.append(probs)
            return drawn
        best = logits.argmax(dim=-1)  # (M,)
        one_hot = torch.zeros_like(probs).scatter_(1, best[:, None], 1.0)
        self.steps.append(torch.where(self.draw_rows[:, None], probs, one_hot))
        return torch.where(self.draw_rows, drawn, best)

    def target_probs(
        self, num_steps: int, draft_vocab_ids: torch.Tensor | None, vocab_size: int
    ) -> torch.Tensor:
        """q per request and head step over the target vocabulary: (M, num_steps, V) float32,
        zero outside the draft vocabulary and for steps not drafted (every chain stopped)."""
        m = self.temperature.shape[0]
        q = torch.zeros(m, num_steps, vocab_size, device=self.temperature.device)
        if not self.steps:
            return q
        drafted = torch.stack(self.steps, dim=1)  # (M, steps drafted, N)
        if draft_vocab_ids is None:
            q[:, : drafted.shape[1]] = drafted
        else:
            q[:, : drafted.shape[1]].index_copy_(2, draft_vocab_ids, drafted)
        return q


def inverse_cdf(
    weights: torch.Tensor, generators: dict[int, torch.Generator] | None = None
) -> torch.Tensor:
    """One draw per row of weights (M, N) >= 0, each row normalised by its own sum: the
    first index whose cumulative weight exceeds u * total, u ~ U[0, 1) drawn with the row's
    generator where `generators` has one. One random number per row, where an exponential
    race draws N of them (the timings: docs/history/benchmarks-2026-11.md). The sums run in
    float64, so rounding moves no draw by more than ~1e-12 of probability; a row of zeros
    gives index N - 1. Example: weights [1, 1, 2], u = 0.6 -> cdf [1, 2, 4], u * 4 = 2.4 ->
    index 2."""
    cdf = weights.double().cumsum(dim=-1)  # (M, N)
    u = torch.rand(weights.shape[0], 1, dtype=torch.float64, device=weights.device)
    for row, generator in (generators or {}).items():
        u[row] = torch.rand(1, dtype=torch.float64, device=weights.device, generator=generator)
    drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # (M, 1)
    return drawn.squeeze(-1).clamp_(max=weights.shape[-1] - 1)


def residual_tokens(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """The token the rejection sampler emits where it rejects a draft: one draw per draft
    position from max(p - q, 0) normalised; q one-hot at the draft where `draft_probs` is
    None (greedy or ngram drafts), so the draft's own p is zeroed. Rows are draft positions
    (N, V), grouped by request as `num_draft_tokens` says; a seeded request (`generators`,
    by request index) draws its rows' uniforms from its own generator. Example: p = [0.5,
    0.3, 0.2] for draft 0 without q -> draws from [0, 0.3, 0.2] / 0.5: 1 with probability
    0.6, 2 with 0.4. Returns (N,) in draft_token_ids' dtype."""
    if draft_probs is not None:
        residual = (target_probs - draft_probs).clamp_(min=0.0)  # (N, V)
    else:
        residual = target_probs.clone()
        rows = torch.nonzero(draft_token_ids >= 0).squeeze(-1)  # -1: a draft grammar refused
        residual[rows, draft_token_ids[rows].long()] = 0.0
    starts = [0, *itertools.accumulate(num_draft_tokens)]
    row_generators = {
        row: generator
        for request, generator in generators.items()
        for row in range(starts[request], starts[request + 1])
    }
    return inverse_cdf(residual, row_generators).to(draft_token_ids.dtype)
