"""Which prefix-cache hits must give up their last block: the next-token fusion's one slot.

Clover-2's draft KV at a full block's last slot read the token that followed the block in the
request that filled it. vLLM drops the last block of every hit for EAGLE; here a hit keeps it
where the new request's next token is the one the block was filled with (`BlockFollowers`),
as it almost always is. A block whose follower was never recorded is given up, as vLLM would.
How it works: docs/design/drafting.md, "Prefix-cache blocks and the next-token fusion".
"""

from __future__ import annotations

from collections.abc import Sequence


class BlockFollowers:
    """block id -> the token that followed the block when its draft KV was computed.
    `record` is told a request's blocks after each allocation; `keeps` decides a hit. A
    refilled block gets its new follower over the old one; until then it has none."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._following: dict[int, int] = {}
        self._next_block: dict[str, int] = {}  # request id -> its first block not recorded

    def record(self, req_id: str, blocks: Sequence, token_ids: Sequence[int]) -> None:
        """Record the follower of each of the request's cached blocks (`blocks`: its KV
        blocks in order, those vLLM cached with a `block_hash`) that is known in `token_ids`
        (its final tokens, drafts excluded); a follower not yet known is recorded at a later
        call."""
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
