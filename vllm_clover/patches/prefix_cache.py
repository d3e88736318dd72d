"""The `prefix_block_drop` patch: Clover-2 engines give up a prefix-cache hit's last block
only where its draft KV is stale (``prefix_blocks.py``). How it works:
docs/design/engine-layer.md, "Prefix-cache blocks"."""

from __future__ import annotations

import functools

from vllm_clover.core.prefix_blocks import BlockFollowers
from vllm_clover.patches.marking import CLOVER_METHOD, is_patched, mark


def block_followers(vllm_config, kv_cache_config) -> BlockFollowers | None:
    """The followers table for this scheduler, or None where vLLM's rule stays (not Clover,
    heads without the next-token fusion, or prefix caching off)."""
    from vllm_clover.core.checks import CloverStartupError

    spec = vllm_config.speculative_config
    if spec is None or spec.method != CLOVER_METHOD:
        return None
    if not vllm_config.cache_config.enable_prefix_caching:
        return None
    if not getattr(spec.draft_model_config.hf_config, "fuse_next_token", False):
        return None
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:  # the Augmenting Block mirrors a full-attention layer: one group
        raise CloverStartupError(
            "Clover heads with the next-token fusion need the target and the Augmenting "
            f"Block in one KV-cache group for prefix caching; this engine has {len(groups)}: "
            "pass enable_prefix_caching=False"
        )
    return BlockFollowers(groups[0].kv_cache_spec.block_size)


def follow_blocks(manager, followers: BlockFollowers) -> None:
    """Wrap this KV-cache manager's methods (instance attributes) to record and apply
    `followers`."""
    get_computed, allocate, cache, free = (
        manager.get_computed_blocks,
        manager.allocate_slots,
        manager.cache_blocks,
        manager.free,
    )

    def record(request) -> None:
        blocks = manager.coordinator.get_blocks(request.request_id)[0]
        followers.record(request.request_id, blocks, request.all_token_ids)

    @functools.wraps(get_computed)
    def get_computed_blocks(request):
        blocks, hit, boundary = get_computed(request)
        if hit and not followers.keeps(blocks.blocks[0][-1].block_id, request.all_token_ids[hit]):
            kept = tuple(list(group[:-1]) for group in blocks.blocks)
            blocks, hit = manager.create_kv_cache_blocks(kept), hit - followers.block_size
        return blocks, hit, boundary

    @functools.wraps(allocate)
    def allocate_slots(request, *args, **kwargs):
        new_blocks = allocate(request, *args, **kwargs)
        if new_blocks is not None:
            record(request)
        return new_blocks

    @functools.wraps(cache)
    def cache_blocks(request, num_computed_tokens: int) -> None:
        cache(request, num_computed_tokens)
        record(request)

    @functools.wraps(free)
    def free_blocks(request) -> None:
        record(request)
        followers.forget(request.request_id)
        free(request)

    manager.get_computed_blocks = get_computed_blocks
    manager.allocate_slots = allocate_slots
    manager.cache_blocks = cache_blocks
    manager.free = free_blocks


def patch_prefix_block_drop() -> None:
    """Wrap `Scheduler.__init__`: a Clover-2 engine's KV-cache manager follows its blocks."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if is_patched(Scheduler.__init__, "prefix_block_drop"):
        return
    init = Scheduler.__init__

    @functools.wraps(init)
    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs) -> None:
        init(self, vllm_config, kv_cache_config, *args, **kwargs)
        followers = block_followers(vllm_config, kv_cache_config)
        if followers is not None:
            follow_blocks(self.kv_cache_manager, followers)

    Scheduler.__init__ = mark(__init__, "prefix_block_drop")
