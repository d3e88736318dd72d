"""Prompt lookup: the tokens that followed the last occurrence of a request's suffix.

The rule is vLLM's ngram proposer's (``vllm/v1/spec_decode/ngram_proposer.py``): the longest
suffix n-gram of the history, min_n <= n <= max_n, that occurs earlier with at least one
token after it, at its earliest occurrence; up to k tokens after that occurrence, never past
max_model_len. vLLM's kernel is compiled by numba, whose import breaks later engine starts in
a process on CPU, so this is the same rule in NumPy (tests compare the two), and it returns the
match length n, which the choice of source reads.

Example: history [5 9 2 7 5 9 2], n in 2..3: the suffix [9 2] ... [5 9 2] occurs at 0-2, so
n = 3 and the continuation starts at 3: [7 5 9 2] for k = 4.
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
