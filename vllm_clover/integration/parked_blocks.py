"""Full KV blocks whose Augmenting Block rows have not run: parked until a request reads them.

`BlockDeferral` (``deferred_block.py``) lets a step that drafts nothing keep the block's
input rows of each request's last, partial KV block, to run them when the request drafts.
A block that fills cannot simply wait with its request: prefix caching shares full blocks,
so a later request that hits one reads its draft KV, and the request that filled it may
have finished by then. So the rows of a block that fills at a step that drafts nothing are
parked under the block itself: their block input x (what the block reads at each position,
D wide, computed once when the block fills; 1.2 KB a token for D = 576 in bfloat16) and
their KV slots, keyed by the block's id in the drafter's block table. A step that drafts
runs, before a request's own rows, the parked blocks its block table holds right before
them: its own, or those of the request whose prompt it shares. A request that never drafts
never runs them, and at a K = 0 step nothing of the block runs at all.

A block stays parked until it is read or vLLM gives it to other tokens: a step whose slots
write into a parked block (the target's KV there is new) drops what is parked there, which
nobody could read any more (prefix caching matches a block only through the blocks before
it, and a live request's blocks are never reused). Each KV slot holds at most one parked
row, so parking takes at most D values per KV-cache slot.

Worked example, block size 4, request a's block table (25, 26, 27) over positions 0-11:
a step at K = 0 accepts a's position 7, so block 26 (positions 4-7) is full: a's rows 4-7
are parked under 26 (rows 0-3 were run when a drafted at position 3). Request b, whose
prompt shares a's first 8 tokens, gets the table (25, 26, 31) and drafts at position 8: its
pass runs the rows parked under 26 (table entry 1, positions 4-7), then its own from 8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class BlockInput:
    """Rows the block runs as they are: x at positions start, start + 1, ..., with slots."""

    start: int
    x: torch.Tensor  # [n, D]: the block's input at each position
    slots: torch.Tensor  # [n]: the block's KV-cache slot of each position

    @property
    def count(self) -> int:
        return self.x.shape[0]

    @property
    def end(self) -> int:
        return self.start + self.count

    def first(self, n: int) -> BlockInput:
        """Split off and return the first n rows (positions start .. start + n - 1)."""
        taken = BlockInput(self.start, self.x[:n], self.slots[:n])
        self.start, self.x, self.slots = self.start + n, self.x[n:], self.slots[n:]
        return taken

    @staticmethod
    def cat(parts: Sequence[BlockInput]) -> BlockInput:
        """The parts' rows one after the other (start: the first part's)."""
        if len(parts) == 1:
            return parts[0]
        x = torch.cat([part.x for part in parts])
        return BlockInput(parts[0].start, x, torch.cat([part.slots for part in parts]))


class ParkedBlocks:
    """Parked rows per block of the drafter's block table (`block_size` positions each)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[int, BlockInput] = {}
        self.rows = 0  # parked rows in all

    def park(self, rows: BlockInput) -> None:
        """Park `rows`, all in full blocks, one entry per block they fall in."""
        size = self.block_size
        blocks = (rows.slots // size).tolist()  # each row's block, read once
        done = 0
        while rows.count:
            n = min(rows.count, size - rows.start % size)
            block, done = blocks[done], done + n
            piece = rows.first(n)
            previous = self.blocks.get(block)
            self.rows += n - (0 if previous is None else previous.count)
            self.blocks[block] = BlockInput(piece.start, piece.x.clone(), piece.slots.clone())

    def release(self, slots: torch.Tensor) -> int:
        """Drop what is parked in the blocks that `slots` write; the rows dropped."""
        if not self.blocks:
            return 0
        dropped = 0
        for block in torch.unique(slots // self.block_size).tolist():
            rows = self.blocks.pop(block, None)
            dropped += 0 if rows is None else rows.count
        self.rows -= dropped
        return dropped

    def claim(self, block_tables: torch.Tensor, ends: Sequence[int]) -> list[BlockInput | None]:
        """For each request (row i of `block_tables`), the rows parked in its blocks that
        end at position ends[i] and reach back without a gap, as one BlockInput (None where
        there are none). They are no longer parked; a block two requests read is run by
        both (it holds the same rows for both, and the second run writes what the first
        wrote).

        Example, block size 4, ends (8, 6): request 0's entries 1 and 0 are looked up (the
        blocks of positions 4-7, then 0-3) while they are parked and full up to where the
        next begins; request 1 ends inside a block, which cannot be full: None.
        """
        if not self.blocks or not ends:
            return [None] * len(ends)
        # Only the entries a chain can reach: one host copy of the columns before the
        # furthest end (the whole table would be copied from the GPU at every step).
        columns = max(ends) // self.block_size
        tables = block_tables[: len(ends), :columns].cpu().numpy()
        claimed: dict[int, BlockInput] = {}
        chains = []
        for i, end in enumerate(ends):
            chain = self._chain(tables[i], end)
            claimed.update(chain)
            chain_rows = list(reversed(chain.values()))
            chains.append(BlockInput.cat(chain_rows) if chain_rows else None)
        for block in claimed:
            self.rows -= self.blocks.pop(block).count
        return chains

    def _chain(self, table, end: int) -> dict[int, BlockInput]:
        """{block: rows} parked in `table`'s blocks, last first, ending at `end`."""
        chain: dict[int, BlockInput] = {}
        if end % self.block_size:
            return chain
        for index in range(end // self.block_size - 1, -1, -1):
            block = int(table[index])
            rows = self.blocks.get(block)
            if rows is None or rows.end != end:
                break
            chain[block] = rows
            end = rows.start
            if rows.start != index * self.block_size:  # the rows before it have run
                break
        return chain
