"""`HybridDrafter`: per request and step, Clover's chain or the prompt lookup's, in vLLM's runner.

vLLM's own ngram proposer drafts after the step's bookkeeping, when each request's history
(`input_batch.token_ids_cpu[row, :num_tokens_no_spec[row]]`) holds the tokens the step
accepted. Clover drafts before it, like EAGLE. So the hybrid acts where the runner hands the
drafts to the scheduler (the `draft_lengths` patch, `take_draft_token_ids`, after the
bookkeeping): for each request it settles what its last chain earned (both sources' rates
learn, ``choice.py``), looks its history up (``lookup.py``), and keeps Clover's row or puts
the lookup's continuation in its place, padded with -1 (cut by the patch). A lookup row
drafted at T > 0 gets a one-hot draft distribution: it was not drawn from the heads.

Example, K = 3: Clover's row [12, 7, -1] (a confidence stop) against a lookup match of n = 4
with continuation [40, 41, 42]: with the lookup's rates at 0.8 it is worth 1.95 accepted
tokens against Clover's two drafts at (0.5, 0.3), 0.65: the row becomes [40, 41, 42].
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
class StepTokens:
    """A step's tokens as the proposer sees them, on the host: every scheduled token
    (tokens), each request's first scheduled and last accepted index into them, and t0."""

    tokens: np.ndarray  # [num_tokens]
    starts: np.ndarray  # [num_reqs]
    lasts: np.ndarray  # [num_reqs]
    t0: np.ndarray  # [num_reqs]


@dataclass
class SourceCounts:
    """Per source: chains drafted, draft tokens verified, and accepted."""

    chains: Counter[str] = field(default_factory=Counter)
    verified: Counter[str] = field(default_factory=Counter)
    accepted: Counter[str] = field(default_factory=Counter)
    lookup_only_steps: int = 0  # steps every request drafted from the lookup: no head loop


class HybridDrafter:
    """The lookup beside Clover in one engine: its step's stash, pending chains, rates, counts."""

    def __init__(self, config: LookupConfig, depth: int, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.choice = SourceChoice(depth, config.max_n)
        self.counts = SourceCounts()
        self.pending: dict[str, Pending] = {}
        self._stash: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def lookup_takes_all(self, batch, step: StepTokens, k: int) -> bool:
        """Whether the lookup will be chosen for every request of this step over a chain of
        k drafts from the heads, so that the head loop need not run (a hint: ``finish``
        chooses on the history after the bookkeeping; where the two disagree, a request
        drafts less this step, nothing else changes).

        Called in ``propose``, before vLLM's bookkeeping: a request's history is the one in
        the batch, then the drafts this step accepted, then t0 (``StepTokens``). A row whose
        first scheduled token is not its history's last (a prefill chunk) needs the heads.
        """
        if not k:
            return False
        for row in range(len(step.t0)):  # the proposer's rows are the batch's
            if row in batch.req_prompt_embeds:
                return False
            history = batch.token_ids_cpu[row, : batch.num_tokens_no_spec[row]]
            first, last = step.starts[row], step.lasts[row]
            if not history.size or step.tokens[first] != history[-1]:
                return False
            accepted = step.tokens[first + 1 : last + 1]
            history = np.concatenate([history, accepted, step.t0[row : row + 1]])
            candidate, match = self._lookup(history, k)
            if self.choice.choose(match, len(candidate), k) != LOOKUP:
                return False
        self.counts.lookup_only_steps += 1
        return True

    def _lookup(self, history: np.ndarray, k: int) -> tuple[np.ndarray, int]:
        """The lookup's continuation of at most k tokens and its match length (``lookup.py``)."""
        cfg = self.config
        return prompt_lookup(history, cfg.min_n, cfg.max_n, k, self.max_model_len)

    def stash(self, drafts: torch.Tensor, probs: torch.Tensor | None) -> None:
        """The proposer's step: its drafts [num_reqs, K] and their draw distributions."""
        self._stash = (drafts, probs)

    def finish(self, runner: Any, rows: list[list[int]], req_ids: list[str]) -> None:
        """Settle, look up and choose for every request the runner hands over (in place)."""
        stash, self._stash = self._stash, None
        if stash is None or runner._draft_token_ids is not stash[0]:
            return  # the runner drafted nothing itself (near max_model_len): nothing of ours
        drafts, probs = stash
        batch = runner.input_batch
        for gone in set(self.pending) - set(runner.requests):
            del self.pending[gone]
        for row, req_id in enumerate(req_ids):
            index = batch.req_id_to_index.get(req_id)
            if index is None:
                continue
            history = batch.token_ids_cpu[index, : batch.num_tokens_no_spec[index]]
            self._settle(req_id, history, len(batch.spec_token_ids[index]))
            if index not in batch.req_prompt_embeds:
                self._choose(req_id, rows[row], history, drafts.shape[1], probs, row)

    def _settle(self, req_id: str, history, scheduled: int) -> None:
        """Score the request's last chain (and the lookup's candidate) against the tokens
        the target emitted since; `scheduled`: how many of the chain vLLM verified."""
        last = self.pending.pop(req_id, None)
        emitted = history[last.start :].tolist() if last else []
        if not emitted:
            return
        chain = last.chain[:scheduled]
        rates = self.choice.clover if last.source == CLOVER else self.choice.lookup[last.match]
        accepted = rates.observe(chain, emitted)
        self.counts.verified[last.source] += len(chain)
        self.counts.accepted[last.source] += accepted
        if last.source != LOOKUP and last.match:  # the candidate not chosen, scored all the same
            self.choice.lookup[last.match].observe(last.candidate, emitted)

    def _choose(self, req_id, row: list[int], history, k: int, probs, index: int) -> None:
        clover = row[: row.index(-1)] if -1 in row else list(row)
        candidate, match = self._lookup(history, k)
        candidate = candidate.tolist()
        source = self.choice.choose(match, len(candidate), len(clover))
        chain = candidate if source == LOOKUP else clover
        if source == LOOKUP:
            row[:] = candidate + [-1] * (len(row) - len(candidate))
            if probs is not None:  # a fixed draft: one-hot, as vLLM verifies an ngram draft
                # the proposer made probs under inference mode; the runner hands drafts over
                # outside it, where an in-place write to such a tensor is refused
                with torch.inference_mode():
                    probs[index].zero_()
                    probs[index, torch.arange(len(candidate)), torch.tensor(candidate)] = 1.0
        if chain:
            self.counts.chains[source] += 1
            self.pending[req_id] = Pending(source, chain, len(history), candidate, match)


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
