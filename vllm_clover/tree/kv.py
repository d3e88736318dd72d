"""After acceptance: moving the accepted path's KV entries to where the next step reads them.

Node i was verified at offset 1 + i of the request's speculative part; the next step expects
the accepted path's depth-j node at offset j. Its key was already rotated for position
root + j, so a plain copy is exact; nodes off the path are left behind and overwritten later.

How it works: docs/design/drafting.md, "Compacting the accepted path's KV".
"""

from __future__ import annotations

import torch


def compaction_moves(path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(request, source offset, destination offset) of each entry that must move, from path
    (M, depth): accepted node indices, -1 past the end (``TreeVerdict.path``). Entries
    already in place (a prefix of the chain of rank-0 nodes, say) are left out."""
    depth = path.shape[1]
    source = 1 + path  # (M, depth)
    target = torch.arange(1, depth + 1).expand_as(path)  # (M, depth)
    moves = (path >= 0) & (source != target)
    request = torch.arange(path.shape[0])[:, None].expand_as(path)
    return request[moves], source[moves], target[moves]


def slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of token positions: block table (M, B), positions (M, ...) -> (M, ...),
    slot = block_table[request, position // block_size] * block_size + position % block_size
    (vLLM's slot mapping)."""
    blocks = block_table.gather(1, (positions // block_size).flatten(1)).view_as(positions)
    return blocks * block_size + positions % block_size
