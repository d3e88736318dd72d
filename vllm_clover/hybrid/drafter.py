"""`HybridDrafter`: per request and step, Clover's chain or the prompt lookup's, in `propose`.

From the step's tokens on the host (`StepTokens`), ``plan`` rebuilds each request's history
as the step leaves it, settles what its last chain earned and looks the history up;
``takes_all`` says whether the head loop may be skipped; ``choose`` puts the lookup's
continuation in place of Clover's row where it is worth more.
How it works: docs/design/drafting.md, "The drafter in propose".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vllm_clover.hybrid.choice import CLOVER, LOOKUP, SourceChoice
from vllm_clover.hybrid.lookup import prompt_lookup


@dataclass(frozen=True)
class LookupConfig:
    """speculative_config "lookup": the n-gram lengths matched (vLLM's prompt_lookup_min/max)."""

    min_n: int = 2
    max_n: int = 4

    @classmethod
    def of(cls, value: Any) -> LookupConfig | None:
        """From the config value: None/False (off), True (defaults) or {"min_n", "max_n"}."""
        if value in (None, False):
            return None
        fields = {} if value is True else dict(value)
        unknown = set(fields) - {"min_n", "max_n"}
        if unknown:
            raise ValueError(f'"lookup" takes min_n and max_n, not {", ".join(sorted(unknown))}')
        config = cls(**fields)
        if not 1 <= config.min_n <= config.max_n:
            raise ValueError(f'"lookup" needs 1 <= min_n <= max_n, got {config}')
        return config


@dataclass
class Pending:
    """A request's chain drafted at one step, settled at the next."""

    source: str
    chain: list[int]
    start: int  # history length when it was drafted: the target's tokens follow from here
    candidate: list[int]  # the lookup's continuation, chosen or not
    match: int


@dataclass(frozen=True)
class Lookup:
    """One request's history looked up at this step."""

    req_id: str
    candidate: list[int]  # at most K tokens
    match: int  # n-gram length matched, 0: none
    start: int  # its history's length


@dataclass(frozen=True)
class StepTokens:
    """A step's tokens as the proposer sees them, on the host: every scheduled token
    (tokens), each request's first scheduled and last accepted index into them, the position
    of its first scheduled token, and t0."""

    tokens: np.ndarray  # [num_tokens]
    starts: np.ndarray  # [num_reqs]
    lasts: np.ndarray  # [num_reqs]
    positions: np.ndarray  # [num_reqs]
    t0: np.ndarray  # [num_reqs]

    def carries_prompt(self, batch: Any) -> bool:
        """Whether any request's span starts inside its prompt (a prefill chunk)."""
        prompts = batch.num_prompt_tokens[: len(self.t0)]
        return bool((self.positions < prompts).any())

    def history(self, batch: Any, row: int) -> np.ndarray | None:
        """Request `row`'s tokens up to t0: the batch's before the step's span, the span up to
        its last accepted token, t0. None for a prefill chunk with prompt still to come (its
        drafts are discarded) or a row the batch does not match."""
        first, last, begin = self.starts[row], self.lasts[row], self.positions[row]
        end = begin + last - first + 1  # t0's position
        known = batch.num_tokens_no_spec[row]  # ends at t0 once vLLM's bookkeeping ran
        tokens = batch.token_ids_cpu[row]
        if begin > known or end + 1 < known or end + 1 < batch.num_prompt_tokens[row]:
            return None
        if end < known and tokens[end] != self.t0[row]:
            return None
        span = self.tokens[first : last + 1]
        return np.concatenate([tokens[:begin], span, self.t0[row : row + 1]])


@dataclass
class SourceCounts:
    """Per source: chains drafted, draft tokens verified, and accepted."""

    chains: Counter[str] = field(default_factory=Counter)
    verified: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    lookup_only_steps: int = 0  # steps every request drafted from the lookup: no head loop


class HybridDrafter:
    """The lookup beside Clover in one engine: pending chains, rates, counts."""

    def __init__(self, config: LookupConfig, depth: int, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.choice = SourceChoice(depth, config.max_n)
        self.counts = SourceCounts()
        self.pending: dict[str, Pending] = {}

    def plan(self, batch: Any, step: StepTokens, k: int) -> list[Lookup | None]:
        """Per request (the proposer's rows are the batch's): settle its last chain against
        the tokens since, and look its history up for k drafts. None: the heads draft it."""
        pending, self.pending = self.pending, {}  # requests gone from the batch drop out
        lookups: list[Lookup | None] = []
        for row, req_id in enumerate(batch.req_ids[: len(step.t0)]):
            history = None if row in batch.req_prompt_embeds else step.history(batch, row)
            if history is None:
                lookups.append(None)
                continue
            last = pending.get(req_id)
            if last is not None and last.start == step.positions[row] + 1:  # verified now
                self._settle(last, history, len(batch.spec_token_ids[row]))
            candidate, match = self._lookup(history, k)
            lookups.append(Lookup(req_id, candidate.tolist(), match, len(history)))
        return lookups

    def takes_all(self, lookups: list[Lookup | None], k: int) -> bool:
        """Whether every request takes the lookup even over a full chain of k from the
        heads (a shorter chain is worth less), so that the head loop need not run."""
        every = bool(k) and all(
            x is not None and self.choice.choose(x.match, len(x.candidate), k) == LOOKUP
            for x in lookups
        )
        self.counts.lookup_only_steps += every
        return every

    def choose(self, lookups: list[Lookup | None], drafts: torch.Tensor, probs) -> None:
        """Keep each request's Clover row or put the lookup's continuation in its place
        (drafts [num_reqs, K] and their draw distributions, in place)."""
        for index, (lookup, row) in enumerate(zip(lookups, drafts.tolist(), strict=True)):
            if lookup is None:
                continue
            clover = row[: row.index(-1)] if -1 in row else row
            candidate = lookup.candidate
            source = self.choice.choose(lookup.match, len(candidate), len(clover))
            if source == LOOKUP:
                _put(drafts, probs, index, candidate)
            chain = candidate if source == LOOKUP else clover
            if chain:
                self.counts.chains[source] += 1
                self.pending[lookup.req_id] = Pending(
                    source, chain, lookup.start, candidate, lookup.match
                )

    def _lookup(self, history: np.ndarray, k: int) -> tuple[np.ndarray, int]:
        """The lookup's continuation of at most k tokens and its match length (``lookup.py``)."""
        cfg = self.config
        return prompt_lookup(history, cfg.min_n, cfg.max_n, k, self.max_model_len)

    def _settle(self, last: Pending, history: np.ndarray, scheduled: int) -> None:
        """Score a request's last chain (and the lookup's candidate) against the tokens the
        target emitted since; `scheduled`: how many of the chain vLLM verified."""
        emitted = history[last.start :].tolist()
        chain = last.chain[:scheduled]
        rates = self.choice.clover if last.source == CLOVER else self.choice.lookup[last.match]
        self.counts.verified[last.source] += len(chain)
        self.counts.accepted[last.source] += rates.observe(chain, emitted)
        if last.source != LOOKUP and last.match:  # the candidate not chosen, scored all the same
            self.choice.lookup[last.match].observe(last.candidate, emitted)


def _put(drafts: torch.Tensor, probs: torch.Tensor | None, index: int, chain: list[int]) -> None:
    """Row `index` becomes `chain` padded with -1; at T > 0 its draft distribution one-hot,
    as vLLM verifies an ngram draft."""
    tokens = torch.tensor(chain, device=drafts.device)
    drafts[index] = -1
    drafts[index, : len(chain)] = tokens
    if probs is not None:
        probs[index].zero_()
        probs[index, torch.arange(len(chain), device=probs.device), tokens] = 1.0


def hybrid_drafter(vllm_config: Any, trees: bool) -> HybridDrafter | None:
    """The engine's HybridDrafter where speculative_config has "lookup" (chains only, and not
    under async scheduling, where the runner reads the drafts on the device)."""
    import logging

    spec = vllm_config.speculative_config
    config = LookupConfig.of(getattr(spec, "lookup", None))
    if config is None or trees:
        return None
    logger = logging.getLogger("vllm.clover.hybrid")
    if vllm_config.scheduler_config.async_scheduling:
        logger.warning('Clover: "lookup" is off under async scheduling; pass --no-async-scheduling')
        return None
    logger.info("Clover drafts each request's chain from its heads or its prompt lookup %s", config)
    return HybridDrafter(
        config, spec.num_speculative_tokens, vllm_config.model_config.max_model_len
    )


def lookup_counts(worker: Any) -> tuple[int, int, int]:
    """(draft tokens verified, accepted) of the prompt lookup's chains in this worker's
    engine, and its steps drafted from the lookup alone; zeros without "lookup" (called by
    collective_rpc)."""
    hybrid = getattr(getattr(worker.model_runner, "drafter", None), "hybrid", None)
    if hybrid is None:
        return 0, 0, 0
    counts = hybrid.counts
    return counts.verified[LOOKUP], counts.accepted[LOOKUP], counts.lookup_only_steps
