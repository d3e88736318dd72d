"""Drafts sampled from the heads' own distributions, for requests sampled at temperature > 0.

vLLM's rejection sampler keeps the target's distribution p exactly whatever the draft
distribution q, provided each draft was drawn from q; a drawn draft is accepted with
probability 1 - TV(p, q) on average, an argmax one with p(argmax q). ``DraftSampler`` draws
per request and records q. How it works: docs/design/network.md, "draft_sampling.py".
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
    generator where `generators` has one. Sums in float64; a row of zeros gives N - 1.
    Returns (M,) int64; worked example: docs/design/network.md, "draft_sampling.py"."""
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
    position from max(p - q, 0) normalised, q one-hot at the draft where `draft_probs` is None
    (greedy or ngram drafts). Rows are draft positions (N, V), grouped by request as
    `num_draft_tokens` says; a seeded request (`generators`, by request index) draws with its
    own generator. Returns (N,) in draft_token_ids' dtype; example: docs/design/network.md."""
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
