"""Prompt lookup: the tokens that followed the last occurrence of a request's suffix.

vLLM's ngram proposer's rule in NumPy (its numba kernel's import breaks later engine starts
in a process on CPU; tests compare the two), also returning the match length n, which the
choice of source reads.
How it works: docs/design/drafting.md, "The lookup rule".
"""

from __future__ import annotations

import numpy as np


def prompt_lookup(
    history: np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int
) -> tuple[np.ndarray, int]:
    """(continuation of at most k tokens, match length n), or (empty, 0) without a match."""
    length = history.shape[0]
    k = min(k, max_model_len - length)
    if length < max(min_n, 2) or k <= 0:
        return history[:0], 0
    ends = np.flatnonzero(history[: length - 1] == history[length - 1])  # occurrences' ends
    n, best = 1, ends
    while n < max_n and ends.size:
        ends = ends[ends >= n]
        ends = ends[history[ends - n] == history[length - 1 - n]]
        if not ends.size:
            break
        n, best = n + 1, ends
    if n < min_n or not best.size:
        return history[:0], 0
    start = int(best[0]) + 1  # the earliest occurrence, as vLLM's kernel takes it
    return history[start : start + min(k, length - start)], n
