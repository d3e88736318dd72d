"""After acceptance: moving the accepted path's KV entries to where the next step reads them.

During verification a request's root sits at offset 0 of its speculative part and node i at
offset 1 + i (its own slot), whatever its depth. The next step expects the accepted tokens at
consecutive positions: the node at depth j of the accepted path must sit at offset j. Its
key was already rotated for position root + j (depth-based positions), so a plain copy of
the entry is exact; nodes off the path are simply left behind, past the request's computed
length, and overwritten by later steps.

Example, tree ``[(0,), (1,), (0, 0), (0, 1), (1, 0)]``, accepted path n1 -> n4::

    node    n1  n4
    from     2   5      (offset 1 + node)
    to       1   2      (offset depth)

Every source offset is at least its destination (a depth-j node has index >= j - 1); a
copy that reads all sources before writing (``TreeStep.compact``) is safe when moves overlap.
"""

from __future__ import annotations

import torch


def compaction_moves(path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(request, source offset, destination offset) of each entry that must move.

    path (M, depth): accepted node indices, -1 past the end (``TreeVerdict.path``). Entries
    already in place (a prefix of the chain of rank-0 nodes, say) are left out.
    """
    depth = path.shape[1]
    source = 1 + path  # (M, depth)
    target = torch.arange(1, depth + 1).expand_as(path)  # (M, depth)
    moves = (path >= 0) & (source != target)
    request = torch.arange(path.shape[0])[:, None].expand_as(path)
    return request[moves], source[moves], target[moves]


def slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of token positions: block table (M, B), positions (M, ...) -> (M, ...).

    slot = block_table[request, position // block_size] * block_size + position % block_size,
    the paged-cache layout vLLM's slot mapping uses.
    """
    blocks = block_table.gather(1, (positions // block_size).flatten(1)).view_as(positions)
    return blocks * block_size + positions % block_size
