"""Subset trials: a step that tries a K drafts for a few requests of its batch, not all.

The goodput controller (``goodput.py``) tries some Ks on a share of steps: the warm-up cycle,
Ks no decode step of this batch size has measured, close calls. Under load a trial that
drafts for the whole batch pays for every row the Augmenting Block deferred in the K = 0 steps
before it (``deferred_block.py``). In a traced batch-64 run, one such step took 0.98 s
against 0.29 s at K = 0 (docs/benchmarks.md). vLLM verifies per-request draft lengths, so a
trial drafts for a few requests only. The catch-up, the head loop and the verification then
scale with those few, and the controller learns what it needs from them: the acceptance per
request offered K, and the head loop's price per drafting request (its e K B term counts the
requests that drafted, not the batch).

`TrialSubsets` picks those requests on the scheduler, which cannot see the worker's deferred
rows: it estimates how far each request is behind from where it stood when a step last
drafted for it. A request that no step drafted for counts from position 0, so a long prompt
that was just prefilled is picked after requests that are already decoding.

Example, 3 of a batch of 5; `end` is a request's computed tokens after the step, `mark` its
end at the last step that drafted for it:

    request   end   mark   behind
    a         120   118    2
    b         300   250    50
    c         90    -      90    (no step drafted for it yet)
    d         64    60     4
    e         500   496    4
    -> a, d, e   (the least behind; ties keep the batch's order)

Pure Python: the vLLM side (``patches/scheduling.py``) sends the picked request ids to the
worker with the step, where the proposer drafts for them only and the others' rows wait as at
K = 0 (``deferred_passes.run_deferring``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping


class TrialSubsets:
    """Which `size` requests of a step a trial drafts for, and where each one was last drafted."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.marks: dict[str, int] = {}  # request id -> its end at the last step drafting for it

    def pick(self, ends: Mapping[str, int]) -> list[str]:
        """The `size` requests of the step (request id -> end, in batch order) least behind,
        in batch order."""
        behind = sorted(ends, key=lambda req_id: self.behind(req_id, ends[req_id]))
        chosen = set(behind[: self.size])
        return [req_id for req_id in ends if req_id in chosen]

    def behind(self, req_id: str, end: int) -> int:
        """Rows the block may not have run for `req_id`: from its mark, or from 0 where it
        has none or went back past it (a preempted request computes its prompt again)."""
        mark = self.marks.get(req_id, 0)
        return end - mark if mark <= end else end

    def drafted(self, ends: Mapping[str, int], drafting: Collection[str] | None) -> None:
        """Note a step that drafted for `drafting` (None: the whole step)."""
        for req_id in ends if drafting is None else drafting:
            self.marks[req_id] = ends[req_id]

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop finished or aborted requests."""
        for req_id in req_ids:
            self.marks.pop(req_id, None)
