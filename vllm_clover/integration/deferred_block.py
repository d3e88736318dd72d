"""Deferring the Augmenting Block on steps that draft nothing.

The block is causal attention over each request's whole sequence with its own paged KV
cache, so it has to see every position once. Run at every step, it costs a step that drafts
nothing (K = 0, what the goodput budget chooses under load) the fusion of its input, its
layers and vLLM's drafter bookkeeping: 2.0-5.5 ms against a 15-52 ms vanilla step at batch
4-64 on a 2-core Zen 5 (docs/benchmarks.md). `BlockDeferral` lets such a step skip all of it:
what the block would read at each position (the target's signal, the next token, the
KV-cache slot; everything before the block is position-wise) is kept per request, and the
next step that drafts runs it first, in the same pass, each request's query being its
deferred rows followed by its scheduled ones (``deferred_passes.py``). The block's KV cache
then holds what it would have held had the block run at every step, and h0 is the same; a
request that finishes while its rows wait never pays for them.

Worked example, one request decoding one token per step::

    step   K   scheduled positions   block runs over    deferred after the step
    1      0   10                    -                  10
    2      0   11                    -                  10 11
    3      0   12                    -                  10 11 12
    4      4   13                    10 11 12 13        -

A deferred row whose position is scheduled again is dropped, since the scheduled row
replaces it: a rejected draft's row (step 1 scheduled 10 and drafts 11, 12, of which 11 was
rejected, so step 2 schedules 11 again), or a preempted request's rows past what the prefix
cache kept when it resumes. A step's rows are kept once, as the step gave them
(`StepRows`); each request holds index ranges into them, so that deferring costs no copy
per request.

Rows wait with their request only while their KV-cache block is not full. Prefix caching
shares full blocks with later requests (a system prompt, a chat's earlier turns), whose
drafter reads the block's draft KV there and could not run the rows of a request that
finished while they waited; so a step that drafts nothing parks the rows of every block
that its accepted tokens fill under the block itself (``parked_blocks.py``), to be run by
the first request that drafts reading it, and only a request's last, partial block waits
with the request. Example, block size 4, a request accepted up to position 9 and waiting
since 6: rows 6 and 7 are parked under block 4-7, 8 and 9 wait.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.logger import init_logger

from vllm_clover.integration.parked_blocks import BlockInput, ParkedBlocks

logger = init_logger("vllm.clover.deferred_block")


def block_deferral(vllm_config, trees: bool) -> BlockDeferral | None:
    """A `BlockDeferral` where the block's rows may wait (`why_block_runs` finds nothing)."""
    why_not = why_block_runs(vllm_config, trees)
    if why_not is None:
        return None
    if why_not:
        logger.info("Clover: the Augmenting Block runs at every step (%s)", ", ".join(why_not))
        return None
    logger.info("Clover: steps that draft nothing defer the Augmenting Block")
    return BlockDeferral(vllm_config.cache_config.block_size)


def why_block_runs(vllm_config, trees: bool) -> list[str] | None:
    """Why the block's rows cannot wait on steps that draft nothing: [] where they wait
    (heads with an Augmenting Block, `defer_block` on, the default; chains, one step at a
    time, no data parallelism, whose ranks pad their passes to one size), the reasons where
    they run at every step, None where the heads have no block. Under async scheduling the
    goodput budget, the one that drafts nothing under load, is off anyway."""
    spec = vllm_config.speculative_config
    config = spec.draft_model_config.hf_config
    if not (config.use_augmenting_block and config.num_augmenting_layers):
        return None
    return [
        reason
        for reason, applies in (
            ("defer_block is false", getattr(spec, "defer_block", None) is False),
            ("a token tree", trees),
            ("async scheduling", vllm_config.scheduler_config.async_scheduling),
            ("a batch queue", vllm_config.max_concurrent_batches > 1),
            ("data parallelism", vllm_config.parallel_config.data_parallel_size > 1),
        )
        if applies
    ]


def next_token_ids_after(
    token_ids: torch.Tensor, next_token_ids: torch.Tensor, last: torch.Tensor
) -> torch.Tensor:
    """[num_tokens] the token after each scheduled position, what a next-token fusion reads:
    the scheduled ids shifted one left, and at each request's last accepted token (`last`,
    [num_reqs]) the token the target just sampled (EAGLE's first-pass input ids).

    Example: requests a, b scheduled [a1 a2 | b1], last accepted (1, 2), sampled (a3, b2):
    [a2 a3 b2].
    """
    ids = token_ids.roll(-1)
    ids[last] = next_token_ids.to(ids.dtype)
    return ids


@dataclass(frozen=True)
class StepRows:
    """One step's rows as the block reads them, in the step's token order."""

    signal: torch.Tensor  # [num_tokens, W]: the target's rows (H, or [H | L_a ...])
    next_ids: torch.Tensor  # [num_tokens]: the token after each position
    slots: torch.Tensor  # [num_tokens]: the block's KV-cache slot of each position


Segment = tuple[StepRows, int, int]  # rows begin..end - 1 of one step
BlockInputOf = Callable[[StepRows], torch.Tensor]  # rows -> x [N, D], what the block reads


def gather(segments: Sequence[Segment]) -> StepRows:
    """The rows of `segments`, concatenated in order: each distinct step they come from gives
    its rows once (not one piece per segment: a catch-up reads thousands of one-row
    segments), then one index_select per column puts them in the segments' order. A step
    gives its rows as a slice where one segment reads it (the usual case: a request's row of
    each decode step since its block began, a view, no copy), else as an index_select of
    those rows where they are fewer than half of it (a block that fills at a decode step
    takes a few rows of the prompt chunk it began in, thousands of rows W wide), else whole.
    Where the pieces already stand in the segments' order, the final index_select is skipped
    (so rows from one slice of one step are a view of it: read them before the step changes).

    Example: segments (s1, 0, 2), (s2, 5, 6), (s1, 7, 8), s1 8 rows long, s2 6: s1 gives
    rows 0, 1, 7 (an index_select: fewer than half) and s2 row 5 (a slice); the
    concatenation is those four rows (s1 0, s1 1, s1 7, s2 5), and the index (0, 1, 3, 2)
    reads them in the segments' order: s1 0, s1 1, s2 5, s1 7.
    """
    steps: dict[int, tuple[StepRows, list[tuple[int, int]]]] = {}
    for step, begin, end in segments:
        steps.setdefault(id(step), (step, []))[1].append((begin, end))
    if len(steps) == len(segments):  # each step read once: the slices, in order
        return _concatenated([(step, slice(begin, end)) for step, begin, end in segments], None)
    pieces, places, total = [], {}, 0  # places: id -> concatenation row of each step row
    for key, (step, ranges) in steps.items():
        size = step.slots.shape[0]
        if len(ranges) == 1:  # one segment: its rows as a view
            rows, taken = np.arange(*ranges[0]), slice(*ranges[0])
        else:
            rows = np.unique(np.concatenate([np.arange(begin, end) for begin, end in ranges]))
            if 2 * len(rows) >= size:  # most of it: the step whole, not cut first
                rows, taken = np.arange(size), None
            else:
                taken = torch.from_numpy(rows).to(step.slots.device)
        places[key] = np.full(size, -1)
        places[key][rows] = np.arange(total, total + len(rows))
        pieces.append((step, taken))
        total += len(rows)
    index = np.concatenate([places[id(step)][begin:end] for step, begin, end in segments])
    in_order = len(index) == total and bool((index == np.arange(total)).all())
    return _concatenated(pieces, None if in_order else torch.from_numpy(index))


def _concatenated(
    pieces: list[tuple[StepRows, slice | torch.Tensor | None]], index: torch.Tensor | None
) -> StepRows:
    """The pieces' rows one after the other, then (where given) reordered by `index`."""
    device = pieces[0][0].slots.device
    index = None if index is None else index.to(device)

    def column(name: str) -> torch.Tensor:
        values = [_rows_of(getattr(step, name), taken) for step, taken in pieces]
        value = values[0] if len(values) == 1 else torch.cat(values)
        return value if index is None else value.index_select(0, index)

    return StepRows(column("signal"), column("next_ids"), column("slots"))


def _rows_of(values: torch.Tensor, taken: slice | torch.Tensor | None) -> torch.Tensor:
    """`values`' rows `taken`: a slice (a view), an index (a copy), or None (all)."""
    if taken is None:
        return values
    if isinstance(taken, slice):
        return values[taken]
    return values.index_select(0, taken)


@dataclass
class DeferredRows:
    """One request's rows the block has not run yet, at positions start, start + 1, ..."""

    start: int
    segments: list[Segment] = field(default_factory=list)
    count: int = 0  # rows in the segments

    def append(self, step: StepRows, begin: int, end: int) -> None:
        self.segments.append((step, begin, end))
        self.count += end - begin

    def keep_before(self, position: int) -> None:
        """Drop the rows at `position` and after."""
        if position >= self.start + self.count:
            return
        keep, segments = position - self.start, self.segments
        self.segments, self.count = [], 0
        for step, begin, end in segments:
            if keep <= 0:
                break
            self.append(step, begin, min(end, begin + keep))
            keep -= end - begin

    def first(self, n: int) -> DeferredRows:
        """Split off and return the first n rows (positions start .. start + n - 1)."""
        taken = DeferredRows(self.start)
        while taken.count < n:
            step, begin, end = self.segments.pop(0)
            if end - begin > n - taken.count:
                cut = begin + n - taken.count
                self.segments.insert(0, (step, cut, end))
                end = cut
            taken.append(step, begin, end)
        self.start += n
        self.count -= n
        return taken


@dataclass
class DeferralStats:
    deferred: int = 0  # rows the block skipped at a step that drafted nothing
    caught_up: int = 0  # deferred (or parked) rows it ran later, before a step's own rows
    dropped: int = 0  # rows scheduled again (rejected, preempted), of ended requests, or
    # parked in a block that vLLM gave to other tokens
    passes: int = 0  # steps whose block pass ran deferred rows before their own
    backlog_passes: int = 0  # passes of deferred rows alone: parked ones, or too many waited
    parked: int = 0  # rows parked at steps that drafted nothing, their KV block full


class BlockDeferral:
    """The Augmenting Block's deferred rows: per request id while their KV block is partial,
    parked per block (of `block_size` positions, the block table's unit) once it is full."""

    def __init__(self, block_size: int) -> None:
        self.waiting: dict[str, DeferredRows] = {}
        self.parked = ParkedBlocks(block_size)
        self.stats = DeferralStats()

    def defer(
        self,
        req_ids: Sequence[str],
        first_positions: Sequence[int],
        spans: Sequence[tuple[int, int]],
        step: StepRows,
    ) -> None:
        """Keep the rows of a step the block skips for these requests: request i's are
        rows spans[i][0] .. spans[i][1] - 1 of `step`, at positions first_positions[i], ...
        The step's tensors are copied once (the runner reuses its buffers)."""
        step = StepRows(step.signal.clone(), step.next_ids.clone(), step.slots.clone())
        for req_id, first, (begin, end) in zip(req_ids, first_positions, spans, strict=True):
            rows = self._trimmed(req_id, first)
            if rows is None:
                rows = self.waiting[req_id] = DeferredRows(first)
            rows.append(step, begin, end)
            self.stats.deferred += end - begin

    def take(
        self, req_ids: Sequence[str], first_positions: Sequence[int]
    ) -> list[DeferredRows | None]:
        """Each request's deferred rows (None where it has none), removed from the store,
        after dropping those at or past the request's first scheduled position."""
        taken = []
        for req_id, position in zip(req_ids, first_positions, strict=True):
            rows = self._trimmed(req_id, position)
            if rows is not None:
                del self.waiting[req_id]
                self.stats.caught_up += rows.count
            taken.append(rows)
        return taken

    def take_before(self, req_ids: Sequence[str], ends: Sequence[int]) -> list[DeferredRows | None]:
        """Each request's deferred rows at positions before ends[i] (None where it has
        none), removed from the store; the later ones keep waiting."""
        taken = []
        for req_id, end in zip(req_ids, ends, strict=True):
            rows = self.waiting.get(req_id)
            if rows is None or rows.start >= end:
                taken.append(None)
                continue
            taken.append(rows.first(min(end - rows.start, rows.count)))
            if rows.count == 0:
                del self.waiting[req_id]
        return taken

    def park(self, taken: Sequence[DeferredRows | None], block_input: BlockInputOf) -> None:
        """Park the rows `taken` from requests whose KV blocks they fill, as the block's
        input (`block_input` turns StepRows into x [N, D], in one call for all)."""
        taken = [rows for rows in taken if rows is not None]
        if not taken:
            return
        rows = gather([segment for deferred in taken for segment in deferred.segments])
        x, begin = block_input(rows), 0
        for deferred in taken:
            end = begin + deferred.count
            self.parked.park(BlockInput(deferred.start, x[begin:end], rows.slots[begin:end]))
            self.stats.parked += deferred.count
            begin = end

    def claim(self, block_tables: torch.Tensor, ends: Sequence[int]) -> list[BlockInput | None]:
        """Each request's parked rows that end where its own rows begin, ends[i]
        (``ParkedBlocks.claim``); no longer parked."""
        chains = self.parked.claim(block_tables, ends)
        self.stats.caught_up += sum(chain.count for chain in chains if chain is not None)
        return chains

    def release(self, slots: torch.Tensor) -> None:
        """Drop what is parked in the KV blocks a step writes (vLLM gave them to new tokens)."""
        self.stats.dropped += self.parked.release(slots)

    def forget(self, live: Container[str]) -> None:
        """Drop the rows of requests that are no longer live (finished or aborted)."""
        for req_id in [r for r in self.waiting if r not in live]:
            self.stats.dropped += self.waiting.pop(req_id).count

    def _trimmed(self, req_id: str, position: int) -> DeferredRows | None:
        """req_id's rows before `position`, or None; rows that do not end right before
        `position` cannot be run in one query with it and are dropped too (a hole would
        leave their block KV missing, which only costs draft quality)."""
        rows = self.waiting.get(req_id)
        if rows is None:
            return None
        if rows.start + rows.count == position:  # the usual case: nothing to drop
            return rows
        before = rows.count
        rows.keep_before(position)
        if rows.start + rows.count != position or rows.count == 0:
            del self.waiting[req_id]
            self.stats.dropped += before
            return None
        self.stats.dropped += before - rows.count
        return rows
