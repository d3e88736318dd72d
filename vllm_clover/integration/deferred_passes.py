"""The Augmenting Block's passes over deferred rows (``deferred_block.py`` keeps them).

A step that drafts runs each request's deferred rows right before its own scheduled ones,
as one query per request: the block's paged attention then reads a request's earlier KV
entries from its cache and writes the deferred ones on the way, as in a chunked prefill.
Rows parked under full KV blocks (``parked_blocks.py``) come before those: a pass of their
own per step that finds any. When more rows wait than one pass should take (the scheduler's
token budget), backlog passes run the oldest ones first. Each pass gets the step's attention
metadata rewritten for it (`pass_metadata`).

`run_deferring` is the whole step: keep the rows (K = 0) or run them, through the caller's
`block_input(rows) -> x` and `run_block(x, slots, positions, metadata) -> h0`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vllm_clover.integration.deferred_block import (
    BlockDeferral,
    BlockInputOf,
    DeferredRows,
    StepRows,
    gather,
)
from vllm_clover.integration.parked_blocks import BlockInput

# (x [N, D], slots [N], positions [N], attention metadata) -> h0 [N, D]
RunBlock = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]
# CommonAttentionMetadata's fields with one entry per request, which a pass over some of
# the step's requests takes for those only.
PER_REQUEST_FIELDS = (
    "block_table_tensor",
    "is_prefilling",
    "seq_lens_cpu_upper_bound",
    "req_idx",
    "rswa_prefix_lens",
    "encoder_seq_lens",
    "encoder_seq_lens_cpu",
    "dcp_local_seq_lens",
    "dcp_local_seq_lens_cpu_upper_bound",
    "replayssm_decode_base_cpu",
)


def run_deferring(
    deferral: BlockDeferral,
    run_block: RunBlock,
    block_input: BlockInputOf,
    step: StepRows,
    positions: torch.Tensor,
    cad,
    last: torch.Tensor,
    req_ids: Sequence[str],
    block_size: int,
    defer: bool,
    limit: int,
    drafting: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """One step's block work with deferral: h0 [len(drafting), D] at the last accepted row
    (`last` [num_reqs], indices into the step's rows) of each request in `drafting` (runner
    rows, increasing; None: every request), or None when `defer`.

    Rows of requests that do not draft (all when `defer`) wait, or are parked once accepted
    tokens fill their KV blocks. Each drafting request's parked and waiting rows run before
    its own, in passes of at most `limit` rows. Example, drafting (1, 3) of 4 requests:
    0 and 2 keep their rows as at K = 0, 1 and 3 catch up and run theirs; h0 has 2 rows.
    """
    spans = cad.query_start_loc_cpu.tolist()
    first = positions[cad.query_start_loc[:-1]].tolist()
    requests = list(range(cad.num_reqs)) if drafting is None else list(drafting)
    drafts = set() if defer else set(requests)
    waiting = [i for i in range(cad.num_reqs) if i not in drafts]
    deferral.release(step.slots)
    if waiting:
        held = [req_ids[i] for i in waiting]
        deferral.defer(held, [first[i] for i in waiting], [spans[i : i + 2] for i in waiting], step)
        _park_filled(deferral, block_input, held, positions[last[waiting]], block_size)
    if defer:
        return None
    firsts = [first[i] for i in requests]
    taken = deferral.take([req_ids[i] for i in requests], firsts)
    ends = [f if rows is None else rows.start for f, rows in zip(firsts, taken, strict=True)]
    tables = cad.block_table_tensor if drafting is None else cad.block_table_tensor[requests]
    parked = backlog_passes(deferral.claim(tables, ends), requests, limit, 0)
    scheduled = sum(spans[i + 1] - spans[i] for i in requests)
    backlog = backlog_passes(taken, requests, limit, room=max(0, limit - scheduled))
    _run_alone(parked + backlog, run_block, block_input, cad, deferral)
    if drafting is None and all(deferred is None for deferred in taken):  # the usual step
        return run_block(block_input(step), step.slots, positions[: spans[-1]], cad)[last]
    combined, shifts = step_pass(taken, requests, spans, step, positions)
    deferral.stats.passes += any(deferred is not None for deferred in taken)
    x = block_input(combined.rows)
    h0 = run_block(x, combined.rows.slots, combined.positions, pass_metadata(cad, combined))
    return h0[last[requests] + shifts]


def _park_filled(
    deferral: BlockDeferral,
    block_input: BlockInputOf,
    held: list[str],
    last_positions: torch.Tensor,
    block_size: int,
) -> None:
    """Parks the deferred rows of the requests ``held`` that lie in KV blocks the step's
    accepted tokens fill. Example, block_size 16: a request whose last accepted token sits
    at position 37 has filled blocks [0, 16) and [16, 32), so its deferred rows at
    positions below 32 are parked and those at 32-37 keep waiting."""
    filled = [(p + 1) // block_size * block_size for p in last_positions.tolist()]  # 37 -> 32
    deferral.park(deferral.take_before(held, filled), block_input)


def _run_alone(
    passes: list[BlockPass], run_block: RunBlock, block_input: BlockInputOf, cad, deferral
) -> None:
    """Run passes of deferred or parked rows alone (no step rows after them)."""
    for block_pass in passes:
        rows = block_pass.rows
        x = rows.x if isinstance(rows, BlockInput) else block_input(rows)
        run_block(x, rows.slots, block_pass.positions, pass_metadata(cad, block_pass))
        deferral.stats.backlog_passes += 1


@dataclass
class BlockPass:
    """One run of the block over some requests' rows, each request's rows contiguous.

    requests: the runner rows (request indices) taking part, in order; query_lens[j] rows
    of requests[j]; seq_lens: each one's sequence length as far as this pass reaches (None:
    the step's own, for a pass that ends with the step's scheduled rows).
    """

    rows: StepRows | BlockInput  # [N, ...]: waiting rows (and the step's), or parked ones
    positions: torch.Tensor  # [N]
    requests: list[int]
    query_lens: list[int]
    seq_lens: list[int] | None = None


def backlog_passes(
    taken: list[DeferredRows | None] | list[BlockInput | None],
    requests: Sequence[int],
    limit: int,
    room: int,
) -> list[BlockPass]:
    """Passes over the oldest deferred (or parked) rows of `requests` (runner rows; taken[j]
    is requests[j]'s), at most `limit` rows each, until no more than `room` are left for the
    step's own pass; the rows they run are removed from `taken`.

    Example, limit 4, room 2, deferred counts (3, 5): a pass over the first 3 rows of
    request 0 and the first 1 of request 1, then one over 2 more of request 1, which
    leaves (0, 2).
    """
    passes = []
    left = sum(rows.count for rows in taken if rows is not None)
    while left > room:
        budget, parts = min(limit, left - room), []
        for i, rows in enumerate(taken):
            if rows is None or rows.count == 0 or budget == 0:
                continue
            n = min(rows.count, budget)
            parts.append((requests[i], rows.first(n)))
            budget -= n
        passes.append(_pass_over(parts))
        left -= sum(passes[-1].query_lens)
    for i, rows in enumerate(taken):
        if rows is not None and rows.count == 0:
            taken[i] = None
    return passes


def _pass_over(parts: list[tuple[int, DeferredRows]] | list[tuple[int, BlockInput]]) -> BlockPass:
    pieces = [deferred for _, deferred in parts]
    if isinstance(pieces[0], BlockInput):
        rows = BlockInput.cat(pieces)
    else:
        rows = gather([segment for deferred in pieces for segment in deferred.segments])
    spans = [(deferred.start, deferred.start + deferred.count) for _, deferred in parts]
    return BlockPass(
        rows=rows,
        positions=torch.cat([torch.arange(a, b) for a, b in spans]).to(rows.slots.device),
        requests=[i for i, _ in parts],
        query_lens=[b - a for a, b in spans],
        seq_lens=[b for _, b in spans],
    )


def step_pass(
    taken: list[DeferredRows | None],
    requests: Sequence[int],
    query_start_loc: Sequence[int],
    step: StepRows,
    positions: torch.Tensor,
) -> tuple[BlockPass, torch.Tensor]:
    """The step's own pass over `requests` (runner rows; taken[j] is requests[j]'s deferred
    rows), each one's deferred rows before its scheduled ones, and the shift [len(requests)]
    (int64) from each one's scheduled rows in the step to the same rows in the pass.

    Example: scheduled rows qsl (0, 2, 3), deferred counts (1, 2): the pass runs
    [d0, s0, s1, d1, d1', s2], query lens (3, 3), shifts (1, 3). For requests (1,) alone,
    deferred count 2: [d1, d1', s2], shift 2 - 2 = 0 (s2 is row 2 of both).
    """
    segments, position_parts, query_lens, shifts, start = [], [], [], [], 0
    for request, deferred in zip(requests, taken, strict=True):
        begin, end = query_start_loc[request], query_start_loc[request + 1]
        n = 0 if deferred is None else deferred.count
        if n:
            segments += deferred.segments
            position_parts.append(torch.arange(deferred.start, deferred.start + n))
        segments.append((step, begin, end))
        position_parts.append(positions[begin:end].cpu())
        shifts.append(start + n - begin)  # its scheduled rows begin at start + n in the pass
        query_lens.append(n + end - begin)
        start += n + end - begin
    combined = BlockPass(
        rows=gather(segments),
        positions=torch.cat(position_parts).to(positions.device),
        requests=list(requests),
        query_lens=query_lens,
    )
    return combined, torch.tensor(shifts, device=positions.device)


def pass_metadata(cad, block_pass: BlockPass):
    """The step's CommonAttentionMetadata `cad` rewritten for `block_pass`: its requests,
    query lengths, sequence lengths and KV-cache slots (what vLLM's attention builders and
    the KV-cache write read); the cached per-token lookups are cleared."""
    lens = torch.tensor(block_pass.query_lens, dtype=torch.int32)
    query_start_loc = torch.zeros(len(lens) + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=query_start_loc[1:])
    device = cad.query_start_loc.device
    subset = None
    if block_pass.requests != list(range(cad.num_reqs)):
        subset = torch.tensor(block_pass.requests, device=device)
    if block_pass.seq_lens is None:  # up to each request's scheduled rows
        seq_lens = cad.seq_lens if subset is None else cad.seq_lens[subset]
        max_seq_len = cad.max_seq_len
    else:
        seq_lens = torch.tensor(block_pass.seq_lens, dtype=cad.seq_lens.dtype, device=device)
        max_seq_len = max(block_pass.seq_lens)

    per_request = {
        name: _per_request(getattr(cad, name), block_pass.requests, subset)
        for name in PER_REQUEST_FIELDS
    }
    if block_pass.seq_lens is not None:
        per_request["seq_lens_cpu_upper_bound"] = seq_lens.cpu()
    return cad.replace(
        **per_request,
        query_start_loc=query_start_loc.to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens,
        num_reqs=len(block_pass.query_lens),
        num_actual_tokens=len(block_pass.positions),
        max_query_len=int(lens.max()),
        max_seq_len=max_seq_len,
        slot_mapping=block_pass.rows.slots,
        positions=None,
        mm_req_doc_ranges=None,
        logits_indices_padded=None,
        num_logits_indices=None,
        max_logits_per_req=None,
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )


def _per_request(values, requests: list[int], subset: torch.Tensor | None):
    """A per-request field (tensor on any device, NumPy array or None) for `requests`
    (all of them when `subset` is None)."""
    if subset is None or values is None:
        return values
    if isinstance(values, np.ndarray):
        return values[requests]
    return values[subset.to(values.device)]
