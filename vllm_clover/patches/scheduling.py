"""The `goodput_budget` patch: a Clover engine's scheduler picks each step's K (see the ledger).

vLLM 0.32's scheduler already drafts a per-step K when `num_speculative_tokens_per_batch_size`
is set: it looks K up as `dynamic_sd_lookup[number of requests scheduled]`, sends it to the
runner as `SchedulerOutput.num_spec_tokens_to_schedule`, and stops padding resumed decodes to
K + 1 tokens. The patch puts a `GoodputLookup` in that slot, so the same code path asks the
`GoodputController` instead of a table, and times every step (from `schedule` to
`update_from_output`, which on the synchronous scheduler spans the whole forward, sampling
and drafting) to teach it. A table the user gives stays vLLM's (draft_budget "fixed").

A trial the controller makes at a large batch drafts for a few requests only
(``trial_subset.py``): the patch names them in `SchedulerOutput.clover_drafting` (None: every
request), which travels with the step to the worker, and hands them to the proposer from the
runner's `propose_draft_token_ids`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from vllm.logger import init_logger

from vllm_clover.integration.deferred_block import why_block_runs
from vllm_clover.integration.goodput import GoodputConfig, GoodputController
from vllm_clover.integration.patches.marking import CLOVER_METHOD, is_patched, mark
from vllm_clover.integration.trial_subset import TrialSubsets

logger = init_logger("vllm.clover.patches")

SUMMARY_EVERY = 1000  # steps between the controller's log lines


class GoodputLookup:
    """Stands in for the scheduler's dense batch-size -> K table: `lookup[B]` asks the
    controller for the K of a step with B requests, and tells it how many block rows wait
    (`backlog()`, 0 without a scheduler to read them from)."""

    def __init__(
        self, controller: GoodputController, backlog: Callable[[], float] | None = None
    ) -> None:
        self.controller = controller
        self.backlog = backlog or (lambda: 0)

    def __getitem__(self, batch_size: int) -> int:
        return self.controller.choose(batch_size, self.backlog())


def block_backlog(scheduler) -> int:
    """The Augmenting Block rows of the running requests that no drafting step has run
    (estimated: their computed tokens past where a step last drafted for them; the lookup
    runs before the step's own tokens count as computed)."""
    subsets: TrialSubsets = scheduler.clover_subsets
    return sum(subsets.behind(r.request_id, r.num_computed_tokens) for r in scheduler.running)


def goodput_controller(vllm_config) -> GoodputController | None:
    """The controller for this engine's scheduler, or None where K stays vLLM's (not Clover,
    draft_budget "fixed", or a scheduler that does not run one step at a time). A token tree
    keeps its K, its node count: its goodput budget is the runner's confidence threshold
    (``tree_budget.py``)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.method != CLOVER_METHOD or spec.draft_budget != "goodput":
        return None
    if getattr(spec, "speculative_token_tree", None) is not None:
        return None
    why_not = [
        reason
        for reason, applies in (
            ("async scheduling", vllm_config.scheduler_config.async_scheduling),
            ("pipeline parallelism's batch queue", vllm_config.max_concurrent_batches > 1),
            ("data parallelism", vllm_config.parallel_config.data_parallel_size > 1),
        )
        if applies
    ]
    if why_not:
        logger.warning(
            "Clover: goodput draft budget is off under %s (every step drafts K = %d); pass "
            'draft_budget "fixed" to silence this',
            " and ".join(why_not),
            spec.num_speculative_tokens,
        )
        return None
    config = GoodputConfig(
        max_k=spec.num_speculative_tokens,
        max_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        # steps at K = 0 keep the block's rows only where they may wait (deferred_block.py)
        explore_from_zero=why_block_runs(vllm_config, trees=False) != [],
    )
    logger.info("Clover: goodput draft budget, K chosen per step in 0..%d", config.max_k)
    return GoodputController(config)


def verified_drafts(scheduler_output, model_runner_output) -> list[tuple[str, int, int]]:
    """(request id, drafted, accepted) for each request of the step that decoded one token
    plus its drafts (prefill chunks excluded). Example: a, 1 + 3 tokens scheduled with drafts
    [5, 9, 2], sampled [5, 9, 7] -> (a, 3, 2); b, 1 token without drafts -> (b, 0, 0)."""
    sampled = model_runner_output.sampled_token_ids
    index = model_runner_output.req_id_to_index
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    verified = []
    for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
        drafted = len(spec_tokens.get(req_id, ()))
        row = index.get(req_id)
        if num_tokens != 1 + drafted or row is None or not sampled or not sampled[row]:
            continue
        verified.append((req_id, drafted, min(len(sampled[row]) - 1, drafted)))
    return verified


def drafting_subset(scheduler, output) -> tuple[list[str] | None, int]:
    """The requests a scheduled step drafts for (a subset where the controller's choice was
    a trial at a large batch, None for every request or a step that drafts nothing) and the
    block rows it catches up for them before their own (estimated). Notes where each request
    stood when a step drafted for it (``TrialSubsets``). Example: a request at 40 computed
    tokens after a step that scheduled 1 of them, last drafted for at 30: 9 rows caught up."""
    subsets: TrialSubsets = scheduler.clover_subsets
    subsets.forget(output.finished_req_ids)
    if output.num_spec_tokens_to_schedule == 0 or output.total_num_scheduled_tokens == 0:
        return None, 0
    requests, scheduled = scheduler.requests, output.num_scheduled_tokens
    ends = {req_id: requests[req_id].num_computed_tokens for req_id in scheduled}
    drafting = subsets.pick(ends) if scheduler.clover_budget.trial_size else None
    caught_up = sum(
        max(0, subsets.behind(req_id, ends[req_id]) - scheduled[req_id])
        for req_id in (ends if drafting is None else drafting)
    )
    subsets.drafted(ends, drafting)
    return drafting, caught_up


def observe_step(scheduler, scheduler_output, model_runner_output) -> None:
    """Teach the controller one step: its time, its K and the drafts it verified, each
    offered under the previous step's K if the previous step drafted for it."""
    budget: GoodputController = scheduler.clover_budget
    verified = verified_drafts(scheduler_output, model_runner_output)
    offered = None
    if scheduler.clover_last_drafting is not None:  # drafts of a subset trial
        chosen = set(scheduler.clover_last_drafting)
        offered = [budget.last_k if req_id in chosen else 0 for req_id, _, _ in verified]
    drafting = scheduler_output.clover_drafting
    budget.observe_step(
        seconds=time.perf_counter() - scheduler.clover_step_started,
        tokens=scheduler_output.total_num_scheduled_tokens,
        k=scheduler_output.num_spec_tokens_to_schedule,
        batch=len(scheduler_output.num_scheduled_tokens),
        verified=[(drafted, accepted) for _, drafted, accepted in verified],
        drafting=None if drafting is None else len(drafting),
        offered=offered,
        caught_up=getattr(scheduler_output, "clover_caught_up", 0),
    )
    scheduler.clover_last_drafting = drafting
    if budget.cost.observations % SUMMARY_EVERY == 0:
        logger.info("Clover goodput budget: %s", budget.summary())


def patch_goodput_budget() -> None:
    """Wrap `Scheduler.__init__`, `schedule` and `update_from_output` (AsyncScheduler
    inherits them; the controller is never built for it), and the runner's
    `propose_draft_token_ids`, which hands a step's drafting subset to the proposer."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if is_patched(Scheduler.update_from_output, "goodput_budget"):
        return
    init, schedule, update = Scheduler.__init__, Scheduler.schedule, Scheduler.update_from_output

    @functools.wraps(init)
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        init(self, vllm_config, *args, **kwargs)
        self.clover_budget = goodput_controller(vllm_config)
        if self.clover_budget is not None:
            self.clover_subsets = TrialSubsets(self.clover_budget.config.trial_requests)
            self.dynamic_sd_lookup = GoodputLookup(self.clover_budget, lambda: block_backlog(self))
            self.clover_last_drafting = None

    @functools.wraps(schedule)
    def timed_schedule(self, *args, **kwargs):
        self.clover_step_started = time.perf_counter()
        output = schedule(self, *args, **kwargs)
        if getattr(self, "clover_budget", None) is not None:
            output.clover_drafting, output.clover_caught_up = drafting_subset(self, output)
        return output

    @functools.wraps(update)
    def update_from_output(self, scheduler_output, model_runner_output):
        budget = getattr(self, "clover_budget", None)
        if budget is not None and scheduler_output.total_num_scheduled_tokens > 0:
            observe_step(self, scheduler_output, model_runner_output)
        return update(self, scheduler_output, model_runner_output)

    Scheduler.__init__ = mark(__init__, "goodput_budget")
    Scheduler.schedule = mark(timed_schedule, "goodput_budget")
    Scheduler.update_from_output = mark(update_from_output, "goodput_budget")
    _patch_runner_subset()


def _patch_runner_subset() -> None:
    """Hand `SchedulerOutput.clover_drafting` to a Clover proposer before it drafts."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if hasattr(drafter, "drafting"):
            drafter.drafting = getattr(scheduler_output, "clover_drafting", None)
        return original(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.propose_draft_token_ids = mark(propose_draft_token_ids, "goodput_budget")
