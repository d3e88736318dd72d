"""The resting Augmenting Block: at which steps the block skips its pass (`RestRule`), and
which requests and KV pages that leaves without valid draft KV (`StaleBook`).

Heads with an Augmenting Block pay for its pass at every step, drafting or not: each token's
K and V must enter the block's paged cache, or later drafts attend to holes. Where the draft
budget has stopped drafting at a batch size, that pass is work nobody reads (its share of a
step under load is in docs/benchmarks.md). There the block rests: the step skips the pass.

`RestRule` decides from the step's K and batch size alone, so that the scheduler and the
proposer, which see the same (K, batch) at every step, decide alike without a message: per
batch bucket (the budget's: 33-64 requests is one), an exponential average of the share of
its steps that drafted, starting at 1; the block rests at a K = 0 step of a bucket whose
share is below `max_share`. With memory 0.9 and max_share 0.1, that is after 22
non-drafting steps in a row, and it stays so while the budget explores K > 0 about one step
in 16. One exception: vLLM skips `propose` at a step whose input does not fit the drafter
(near max_model_len), so there the proposer's rule misses a step the scheduler's counted,
and the two may disagree for a few steps. The harm is speed only: a pass skipped that the
book does not know of leaves holes a later hit may draft from (and be rejected); the reverse
runs a pass nobody reads.

`StaleBook` is the scheduler's record of what a rest leaves behind. Every request scheduled
at a resting step is *stale* from then on: its draft KV has a hole, and the scheduler drops
its drafts (and the budget does not count it). Holes spread: a stale request's later draft
KV attends to its holes. So a KV page is *holed* when a resting step or a stale request
writes into it, until a fresh request writes it again from its first slot at a step with
the pass (vLLM refills a freed page from its first slot); a holed page that vLLM caches for
prefix reuse is evicted from the prefix cache, so no later request reads its draft KV.

Worked example, block size 4: a resting step writes request a's positions 5-6 into page 7:
a is stale, page 7 holed. Later a writes position 8 into page 9 at a step with the pass:
page 9 is holed too. When vLLM caches page 7 (full, positions 4-7), it is evicted; a new
request with a's prompt computes those positions again, into a page of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from vllm_clover.budget.goodput import batch_bucket


@dataclass(frozen=True)
class RestConfig:
    memory: float = 0.9  # forgetting per step of a bucket's share of drafting steps
    max_share: float = 0.1  # the block rests at K = 0 where the share is below this


class RestRule:
    """Whether a step's block pass rests, from its K and batch size (`rests`)."""

    def __init__(self, config: RestConfig | None = None) -> None:
        self.config = config or RestConfig()
        self.rested = 0  # resting steps so far
        self.buckets: tuple[int, ...] = ()  # the batch buckets the block has rested at
        self._share: dict[int, float] = {}  # batch bucket -> share of its steps that drafted

    def rests(self, k: int, batch: int) -> bool:
        """Record a step of `batch` requests drafting K each; True if its pass rests."""
        bucket = batch_bucket(batch)
        share = self._next_share(k, bucket)
        self._share[bucket] = share
        resting = k == 0 and share < self.config.max_share
        self.rested += resting
        if resting and bucket not in self.buckets:
            self.buckets = (*self.buckets, bucket)
        return resting

    def would_rest(self, k: int, batch: int) -> bool:
        """What `rests` would answer for this step, recording nothing."""
        return k == 0 and self._next_share(k, batch_bucket(batch)) < self.config.max_share

    def _next_share(self, k: int, bucket: int) -> float:
        memory = self.config.memory
        return memory * self._share.get(bucket, 1.0) + (1 - memory) * (k > 0)


@dataclass(frozen=True)
class Write:
    """One request's tokens in a step: positions start .. start + count - 1, into its KV
    pages (block ids, in position order)."""

    req_id: str
    start: int
    count: int
    pages: Sequence[int]


class StaleBook:
    """Stale requests and holed pages, kept by the scheduler step by step (`step`)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.stale: set[str] = set()
        self.holed: set[int] = set()  # holed pages vLLM has not cached yet
        self.evicted = 0  # holed pages taken out of the prefix cache

    def step(self, resting: bool, writes: Iterable[Write]) -> None:
        """Mark what the step's writes leave: at a resting step every writer goes stale."""
        size = self.block_size
        for write in writes:
            if write.count <= 0:
                continue
            if resting:
                self.stale.add(write.req_id)
            first, last = write.start // size, (write.start + write.count - 1) // size
            written = write.pages[first : last + 1]
            if write.req_id in self.stale:
                self.holed.update(written)
            elif self.holed:
                refilled = write.pages[-(-write.start // size) : last + 1]  # from slot 0
                self.holed.difference_update(refilled)

    def all_stale(self, req_ids: Iterable[str]) -> bool:
        """Whether there are stale requests and every one of `req_ids` is among them: a step
        of such requests would draft only what the scheduler drops."""
        return bool(self.stale) and all(req_id in self.stale for req_id in req_ids)

    def evict_cached(self, cached: Callable[[int], bool], evict: Callable[[set[int]], None]):
        """Evict the holed pages vLLM has cached (`cached(page)`) from its prefix cache."""
        pages = {page for page in self.holed if cached(page)}
        if pages:
            evict(pages)
            self.holed -= pages
            self.evicted += len(pages)

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget finished requests (`live`: the ids the scheduler still holds)."""
        self.stale.intersection_update(live)
