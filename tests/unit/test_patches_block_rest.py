"""The block_rest patch (patches/block_rest.py): which engines may rest the Augmenting Block,
what the scheduler marks and evicts after each step, and whose drafts it drops. The engine
test (tests/engine/test_clover_scheduling.py) runs it in vLLM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_clover import patches
from vllm_clover.patches.block_rest import SchedulerRest, rest_applies
from vllm_clover.patches.channel import SchedulerChannel, attach

pytestmark = pytest.mark.unit

BLOCK = 4


def configs(method="clover", layers=2, tree=None, async_scheduling=False, batches=1, groups=1):
    hf_config = SimpleNamespace(num_augmenting_layers=layers)
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=method,
            speculative_token_tree=tree,
            draft_model_config=SimpleNamespace(hf_config=hf_config),
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        max_concurrent_batches=batches,
    )
    return vllm_config, SimpleNamespace(kv_cache_groups=[object()] * groups)


def test_only_synchronous_chains_with_a_block_rest():
    assert rest_applies(*configs())
    for other in (
        {"method": "eagle"},
        {"layers": 0},
        {"tree": "[(0,), (1,)]"},
        {"async_scheduling": True},
        {"batches": 2},
        {"groups": 2},
    ):
        assert not rest_applies(*configs(**other)), other
    assert not rest_applies(SimpleNamespace(speculative_config=None), configs()[1])


class FakeScheduler:
    """What after_schedule reads of vLLM's Scheduler: requests, their KV blocks, the pool."""

    def __init__(self, pages: dict[str, list[int]]) -> None:
        self.requests = {r: SimpleNamespace(num_computed_tokens=0) for r in pages}
        blocks = {
            p: SimpleNamespace(block_id=p, block_hash=None) for ps in pages.values() for p in ps
        }
        self.evicted: set[int] = set()
        pool = SimpleNamespace(blocks=blocks, evict_blocks=self.evicted.update)
        coordinator = SimpleNamespace(get_blocks=lambda r: ([blocks[p] for p in pages[r]],))
        self.kv_cache_manager = SimpleNamespace(coordinator=coordinator, block_pool=pool)

    def schedule(self, k: int, tokens: dict[str, int]):
        for req_id, count in tokens.items():
            self.requests[req_id].num_computed_tokens += count
        return SimpleNamespace(num_scheduled_tokens=tokens, num_spec_tokens_to_schedule=k)


def test_after_a_rest_the_scheduler_marks_and_evicts():
    scheduler = FakeScheduler({"a": [1, 2, 3, 4, 5, 6, 7], "b": [11, 12, 13, 14, 15, 16, 17]})
    rest = SchedulerRest(BLOCK)
    rest.after_schedule(scheduler, scheduler.schedule(0, {"a": 6, "b": 5}))  # prefill
    for _ in range(21):  # 22 steps without drafts: the last rests
        rest.after_schedule(scheduler, scheduler.schedule(0, {"a": 1, "b": 1}))
    assert rest.rule.rested == 1 and rest.book.stale == {"a", "b"}
    assert rest.book.holed == {7, 17}  # the resting step wrote a's position 26, b's 25
    scheduler.kv_cache_manager.block_pool.blocks[7].block_hash = b"full"
    rest.after_schedule(scheduler, scheduler.schedule(0, {"a": 1}))
    assert scheduler.evicted == {7} and rest.book.evicted == 1 and rest.book.holed == {17}
    del scheduler.requests["b"]
    rest.after_schedule(scheduler, scheduler.schedule(0, {"a": 1}))
    assert rest.book.stale == {"a"}  # b finished: forgotten
    drafting = scheduler.schedule(2, {"a": 1})  # a table's K > 0 where only a runs ...
    rest.after_schedule(scheduler, drafting)
    assert drafting.num_spec_tokens_to_schedule == 0  # ... drafts nothing it would drop
    assert rest.undrafted == 1


def test_the_scheduler_drops_the_drafts_of_stale_requests():
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    patches.apply_patches()
    requests = {
        r: SimpleNamespace(is_finished=lambda: False, is_prefill_chunk=False, spec_token_ids=[])
        for r in "ab"
    }
    scheduler = SimpleNamespace(
        requests=requests,
        structured_output_manager=SimpleNamespace(validate_tokens=lambda request, ids: ids),
    )
    rest = SchedulerRest(BLOCK)
    rest.book.stale.add("a")
    attach(scheduler, SchedulerChannel(rest=rest))
    Scheduler.update_draft_token_ids(scheduler, DraftTokenIds(["a", "b"], [[5, 6], [7]]))
    assert requests["a"].spec_token_ids == [] and requests["b"].spec_token_ids == [7]


def test_an_idle_drafter_answers_before_the_runner_prepares_propose(monkeypatch):
    """The runner's propose_draft_token_ids asks the drafter's idle_step (K, requests,
    tokens) first and returns its drafts; where it answers None, or the drafter has none,
    vLLM's own method runs."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_clover.patches.block_rest import patch_idle_propose

    def vllm_propose(runner, scheduler_output, *args):
        return ("vllm", args)

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", vllm_propose)
    patch_idle_propose()
    asked = []

    def idle_step(k, num_reqs, num_tokens):
        asked.append((k, num_reqs, num_tokens))
        return "idle" if k == 0 else None

    output = SimpleNamespace(num_spec_tokens_to_schedule=0, total_num_scheduled_tokens=12)
    runner = SimpleNamespace(
        drafter=SimpleNamespace(idle_step=idle_step), input_batch=SimpleNamespace(num_reqs=3)
    )
    assert GPUModelRunner.propose_draft_token_ids(runner, output, "sampled") == "idle"
    output.num_spec_tokens_to_schedule = 2
    assert GPUModelRunner.propose_draft_token_ids(runner, output, "sampled") == (
        "vllm",
        ("sampled",),
    )
    assert asked == [(0, 3, 12), (2, 3, 12)]
    other = SimpleNamespace(drafter=object(), input_batch=runner.input_batch)
    assert GPUModelRunner.propose_draft_token_ids(other, output, "x") == ("vllm", ("x",))
