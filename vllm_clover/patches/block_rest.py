"""The `block_rest` patch: a Clover engine's scheduler keeps the resting Augmenting Block's
book (see the ledger and ``core/block_rest.py``).

The proposer skips the block's pass where `RestRule` says so; the scheduler runs the same
rule on the same (K, batch) of every step, and after each `schedule`

- marks the requests and pages the step leaves stale or holed (`StaleBook.step`, from each
  request's scheduled tokens and its KV blocks),
- evicts holed pages that vLLM has cached from the prefix cache (`BlockPool.evict_blocks`),

and `update_draft_token_ids` drops the drafts of stale requests (drafted from holes, they
would only be rejected); the goodput patch leaves them out of what the budget learns. The
runner's `propose_draft_token_ids` asks the proposer first whether the step is idle (K = 0
where the block rests), and then skips what it would prepare for `propose`.
"""

from __future__ import annotations

import functools

from vllm.logger import init_logger

from vllm_clover.core.block_rest import RestRule, StaleBook, Write
from vllm_clover.patches.channel import SchedulerChannel, channel_of, scheduler_channel
from vllm_clover.patches.marking import CLOVER_METHOD, is_patched, mark

logger = init_logger("vllm.clover.patches")


def rest_applies(vllm_config, kv_cache_config) -> bool:
    """Whether this engine's block may rest: Clover chains whose heads have an Augmenting
    Block, one step in flight at a time (no async scheduling, no batch queue: the
    scheduler must take each step's drafts before the next), one KV-cache group. The
    scheduler and the proposer both ask, with the same configs."""
    spec = vllm_config.speculative_config
    if spec is None or spec.method != CLOVER_METHOD:
        return False
    layers = getattr(spec.draft_model_config.hf_config, "num_augmenting_layers", 0)
    return (
        layers > 0
        and getattr(spec, "speculative_token_tree", None) is None
        and not vllm_config.scheduler_config.async_scheduling
        and vllm_config.max_concurrent_batches == 1
        and len(kv_cache_config.kv_cache_groups) == 1
    )


class SchedulerRest:
    """The scheduler's half of the rest: the rule, and the book it keeps."""

    def __init__(self, block_size: int) -> None:
        self.rule = RestRule()
        self.book = StaleBook(block_size)
        self.undrafted = 0  # steps whose K > 0 became 0: every request was stale

    def after_schedule(self, scheduler, output) -> None:
        """Run the rule on the step just scheduled and mark what it leaves."""
        batch = len(output.num_scheduled_tokens)
        if batch == 0:  # the runner proposes nothing: the proposer's rule skips it too
            return
        if output.num_spec_tokens_to_schedule and self.book.all_stale(output.num_scheduled_tokens):
            output.num_spec_tokens_to_schedule = 0  # every draft would be dropped: none made
            self.undrafted += 1
        buckets = self.rule.buckets
        resting = self.rule.rests(output.num_spec_tokens_to_schedule, batch)
        if self.rule.buckets != buckets:
            logger.info(
                "Clover: the Augmenting Block rests at up to %d requests a step, where the "
                "budget stopped drafting; requests running then get no more drafts",
                self.rule.buckets[-1],
            )
        book = self.book
        if not resting and not book.stale and not book.holed:
            return
        coordinator = scheduler.kv_cache_manager.coordinator
        writes = []
        for req_id, count in output.num_scheduled_tokens.items():
            start = scheduler.requests[req_id].num_computed_tokens - count  # schedule advanced it
            pages = [block.block_id for block in coordinator.get_blocks(req_id)[0]]
            writes.append(Write(req_id, start, count, pages))
        book.step(resting, writes)
        pool = scheduler.kv_cache_manager.block_pool
        book.evict_cached(lambda page: pool.blocks[page].block_hash is not None, pool.evict_blocks)
        book.keep_only(scheduler.requests)


def patch_block_rest() -> None:
    """Wrap `Scheduler.__init__`, `schedule` and `update_draft_token_ids`, and the runner's
    `propose_draft_token_ids` (``patch_idle_propose``)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    patch_idle_propose()

    if is_patched(Scheduler.__init__, "block_rest"):
        return
    init, schedule, update = (
        Scheduler.__init__,
        Scheduler.schedule,
        Scheduler.update_draft_token_ids,
    )

    @functools.wraps(init)
    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs) -> None:
        init(self, vllm_config, kv_cache_config, *args, **kwargs)
        if rest_applies(vllm_config, kv_cache_config):
            block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
            scheduler_channel(self).rest = SchedulerRest(block_size)

    @functools.wraps(schedule)
    def rested_schedule(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        channel = channel_of(self, SchedulerChannel)
        if channel is not None and channel.rest is not None:
            channel.rest.after_schedule(self, output)
        return output

    @functools.wraps(update)
    def update_draft_token_ids(self, draft_token_ids) -> None:
        channel = channel_of(self, SchedulerChannel)
        stale = () if channel is None or channel.rest is None else channel.rest.book.stale
        if stale:
            ids, rows = draft_token_ids.req_ids, draft_token_ids.draft_token_ids
            rows = [[] if r in stale else row for r, row in zip(ids, rows, strict=True)]
            draft_token_ids = DraftTokenIds(ids, rows)
        return update(self, draft_token_ids)

    Scheduler.__init__ = mark(__init__, "block_rest")
    Scheduler.schedule = mark(rested_schedule, "block_rest")
    Scheduler.update_draft_token_ids = mark(update_draft_token_ids, "block_rest")


def patch_idle_propose() -> None:
    """Let a Clover drafter answer a step with nothing to draft or write before the runner
    prepares its inputs (``CloverProposer.idle_step``): at K = 0 where the block rests, the
    runner would still gather the next tokens and the target's rows for every request."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids
    if is_patched(original, "block_rest"):
        return

    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        idle_step = getattr(getattr(self, "drafter", None), "idle_step", None)
        if idle_step is not None:
            drafts = idle_step(
                scheduler_output.num_spec_tokens_to_schedule,
                self.input_batch.num_reqs,
                scheduler_output.total_num_scheduled_tokens,
            )
            if drafts is not None:
                return drafts
        return original(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.propose_draft_token_ids = mark(propose_draft_token_ids, "block_rest")
