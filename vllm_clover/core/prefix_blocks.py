"""Which prefix-cache hits must give up their last block: the next-token fusion's one slot.

Heads with the next-token fusion (Clover-2) compute the Augmenting Block's KV at position p
from the target's signal at p and the token at p + 1. Inside a full KV block that token is the
block's own, so its draft KV is a function of the prefix, like the target's KV, except at the
block's last slot, which read the token that followed the block in the request that filled
it. vLLM's answer for EAGLE, whose draft KV has the same shape, is to drop the last block of
every prefix-cache hit and compute it again: a whole block of the prompt (128 tokens on CPU)
through the target, for every request that hits the cache.

The draft KV at that slot is stale only where the new request's token after the hit differs
from the one the block was filled with, and that is rare: a hit ends where the two prompts
first differ rounded down to a block, so unless they differ exactly at the block boundary,
the token after the hit is one they share (a system prompt, a chat's earlier turns, the same
prompt again). `BlockFollowers` records, for every full block a request fills, the token
that followed it; a hit keeps its last block where the request's next token is that one.

Worked example, block size 4. Request a = [5 6 7 8 | 9 1 2 3 | 4] fills blocks 10 and 11:
followers {10: 9, 11: 4}. Request b = [5 6 7 8 | 9 1 2 3 | 4 2] hits both (8 tokens) and
its token 8 is 4: it keeps both. Request c = [5 6 7 8 | 9 1 2 3 | 7] hits both, but its
token 8 is 7: it gives up block 11 and computes positions 4-7 into a block of its own.

Followers are recorded when vLLM caches a block and the token after it is already known (a
prompt that goes on), else at the request's next allocation or when it is freed (a block
filled by a decoded token, whose follower is sampled in the same step). A block whose
follower was never recorded is given up, as vLLM would. vLLM's lookup finds one block per
hash (the first cached): a request like c above computes its own copy of block 11, followed
by 7, but a later request like c still finds block 11 and gives it up.
"""

from __future__ import annotations

from collections.abc import Sequence


class BlockFollowers:
    """block id -> the token that followed the block when its draft KV was computed.

    `record` is told a request's blocks after each allocation; `keeps` decides a hit. A block
    id names a physical block, which vLLM may fill again with other tokens once it is free:
    the next request that fills it records its own follower over the old one, and until that
    follower is known the block has none.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._following: dict[int, int] = {}
        self._next_block: dict[str, int] = {}  # request id -> its first block not recorded

    def record(self, req_id: str, blocks: Sequence, token_ids: Sequence[int]) -> None:
        """Record the follower of each of the request's cached blocks (`blocks`: its KV
        blocks in order, those vLLM cached with a `block_hash`) that is known in `token_ids`
        (its final tokens, drafts excluded). Example, block size 4, blocks 10, 11 cached,
        tokens [5 6 7 8 9 1 2 3]: 10 -> 9; 11's follower is recorded at a later call."""
        index = self._next_block.get(req_id, 0)
        while index < len(blocks) and blocks[index].block_hash is not None:
            follower = (index + 1) * self.block_size
            if follower >= len(token_ids):
                self._following.pop(blocks[index].block_id, None)  # refilled, follower to come
                break
            self._following[blocks[index].block_id] = token_ids[follower]
            index += 1
        self._next_block[req_id] = index

    def forget(self, req_id: str) -> None:
        """The request is freed (after a last `record`)."""
        self._next_block.pop(req_id, None)

    def keeps(self, block_id: int, next_token: int) -> bool:
        """Whether a hit whose last block is `block_id`, followed by `next_token` in the
        request that hits it, keeps that block (the follower recorded is that token)."""
        follower = self._following.get(block_id)
        return follower is not None and follower == next_token
