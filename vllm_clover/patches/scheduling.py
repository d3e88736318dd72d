"""The `goodput_budget` patch: a Clover engine's scheduler picks each step's K through vLLM's
own dynamic-K slot (`dynamic_sd_lookup`), and times every step to teach the controller.
How it works: docs/design/engine-layer.md, "The goodput budget's hook"."""

from __future__ import annotations

import functools
import time

from vllm.logger import init_logger

from vllm_clover.budget.goodput import GoodputConfig, GoodputController
from vllm_clover.patches.channel import SchedulerChannel, channel_of, scheduler_channel
from vllm_clover.patches.marking import CLOVER_METHOD, is_patched, mark

logger = init_logger("vllm.clover.patches")

SUMMARY_EVERY = 1000  # steps between the controller's log lines


class GoodputLookup:
    """Stands in for the scheduler's dense batch-size -> K table: `lookup[B]` asks the
    controller for the K of a step with B requests, telling it whether the step carries
    prompt tokens (read while `schedule` runs, before `num_computed_tokens` advances)."""

    def __init__(self, controller: GoodputController, scheduler) -> None:
        self.controller = controller
        self.scheduler = scheduler  # its `running` list is replaced as requests finish

    def __getitem__(self, batch_size: int) -> int:
        running = self.scheduler.running
        prefill = any(r.num_computed_tokens < r.num_tokens - 1 for r in running)
        return self.controller.choose(batch_size, prefill=prefill)


def goodput_controller(vllm_config) -> GoodputController | None:
    """The controller for this engine's scheduler, or None where K stays vLLM's (not Clover,
    draft_budget "fixed", a tree, or more than one step at a time)."""
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
    )
    logger.info("Clover: goodput draft budget, K chosen per step in 0..%d", config.max_k)
    return GoodputController(config)


def verified_drafts(scheduler_output, model_runner_output) -> list[tuple[int, int]]:
    """(drafted, accepted) for each request of the step that decoded one token plus its
    drafts (prefill chunks excluded), in scheduling order. Example: a, 1 + 3 tokens scheduled
    with drafts [5, 9, 2], sampled [5, 9, 7] -> (3, 2); b, 1 token without drafts -> (0, 0)."""
    sampled = model_runner_output.sampled_token_ids
    index = model_runner_output.req_id_to_index
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    verified = []
    for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
        drafted = len(spec_tokens.get(req_id, ()))
        row = index.get(req_id)
        if num_tokens != 1 + drafted or row is None or not sampled or not sampled[row]:
            continue
        verified.append((drafted, min(len(sampled[row]) - 1, drafted)))
    return verified


def observe_step(channel: SchedulerChannel, scheduler_output, model_runner_output) -> None:
    """Teach the controller one step: its time, its K and the drafts it verified."""
    budget = channel.budget
    verified = verified_drafts(scheduler_output, model_runner_output)
    budget.observe_step(
        seconds=time.perf_counter() - channel.step_started,
        tokens=scheduler_output.total_num_scheduled_tokens,
        k=scheduler_output.num_spec_tokens_to_schedule,
        batch=len(scheduler_output.num_scheduled_tokens),
        verified=verified,
    )
    while budget.notices:
        logger.info("Clover: %s", budget.notices.pop(0))
    if budget.cost.observations % SUMMARY_EVERY == 0:
        logger.info("Clover goodput budget: %s", budget.summary())


def patch_goodput_budget() -> None:
    """Wrap `Scheduler.__init__`, `schedule` and `update_from_output` (AsyncScheduler
    inherits them; the controller is never built for it)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if is_patched(Scheduler.update_from_output, "goodput_budget"):
        return
    init, schedule, update = Scheduler.__init__, Scheduler.schedule, Scheduler.update_from_output

    @functools.wraps(init)
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        init(self, vllm_config, *args, **kwargs)
        budget = goodput_controller(vllm_config)
        if budget is not None:
            scheduler_channel(self).budget = budget
            self.dynamic_sd_lookup = GoodputLookup(budget, self)

    @functools.wraps(schedule)
    def timed_schedule(self, *args, **kwargs):
        channel = channel_of(self, SchedulerChannel)
        if channel is not None:
            channel.step_started = time.perf_counter()
        return schedule(self, *args, **kwargs)

    @functools.wraps(update)
    def update_from_output(self, scheduler_output, model_runner_output):
        channel = channel_of(self, SchedulerChannel)
        tokens = scheduler_output.total_num_scheduled_tokens
        if channel is not None and channel.budget is not None and tokens > 0:
            observe_step(channel, scheduler_output, model_runner_output)
        return update(self, scheduler_output, model_runner_output)

    Scheduler.__init__ = mark(__init__, "goodput_budget")
    Scheduler.schedule = mark(timed_schedule, "goodput_budget")
    Scheduler.update_from_output = mark(update_from_output, "goodput_budget")
