"""Where two greedy runs part, and whether vanilla's two best tokens were a rounding tie there.

In float32 Clover's greedy output equals vanilla's token for token. In bfloat16 it may not:
a verification step scores several tokens per request, matmul shapes that decoding one token
never runs, so where vanilla's two best logits are within bfloat16 rounding of each other the
other token can win, and the two continuations part from there (docs/equivalence.md; vanilla
does the same between its own batch sizes). Such a parting is rounding. One where vanilla's
best token led by more than rounding is a bug.

Example: vanilla [5, 9, 2, 7] and Clover [5, 9, 4, 1] part at index 2. Vanilla, rerun up to
index 2 with logprobs, gives {2: -0.70, 4: -0.82} there: a top-2 gap of 0.12, within
`NEAR_TIE["bfloat16"]`, so a tie. (log-softmax shifts every logit of a position by the same
amount, so the gap of the logprobs is the gap of the logits.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Top-2 logit gaps within rounding: float32 ties are exact up to accumulation order; bfloat16
# ones span up to four bf16 steps at this target's logit magnitudes (16 to 32, a step 0.125).
NEAR_TIE = {"float32": 1e-4, "bfloat16": 0.5}


@dataclass(frozen=True)
class Parting:
    """Where one prompt's two outputs part: the first differing token's index, and
    vanilla's top-2 logprob gap there (None where vanilla's rerun did not reproduce its
    own tokens up to that index, or ended before it)."""

    prompt: int
    token: int
    gap: float | None

    def is_tie(self, dtype: str) -> bool:
        return self.gap is not None and self.gap <= NEAR_TIE[dtype]

    def is_bug(self, dtype: str) -> bool:
        """A known gap beyond `dtype`'s rounding: vanilla's best token clearly led."""
        return self.gap is not None and not self.is_tie(dtype)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first token where `a` and `b` differ (the shorter one's length where
    one is a prefix of the other), None where they are equal. [5, 9, 2], [5, 9, 4] -> 2."""
    if list(a) == list(b):
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def top2_gap(position_logprobs: dict[int, Any]) -> float:
    """Best minus second-best logprob of one position's vLLM logprobs (inf with one)."""
    best = sorted((lp.logprob for lp in position_logprobs.values()), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def vanilla_partings(
    llm: Any,
    chats: list,
    vanilla: list[list[int]],
    other: list[list[int]],
    max_tokens: int | None = None,
) -> list[Parting]:
    """Each prompt whose `other` output differs from `vanilla`, with vanilla's top-2 gap at
    the first differing token, from a greedy rerun with two logprobs per position in `llm`, a
    vanilla engine with the vanilla run's settings.

    With `max_tokens` None the rerun is just the chats that part, each up to its first
    differing token: enough where each prompt ran alone (batch size 1). In bfloat16 the
    numerics of a step depend on which requests share it, so after a run at a larger batch
    size pass the run's `max_tokens`: every chat is rerun as the run ran it, and the same
    requests share the same steps. A rerun that does not reproduce vanilla's tokens up to the
    parting leaves the gap unknown rather than guessed.
    """
    from vllm import SamplingParams

    firsts = [first_difference(a, b) for a, b in zip(vanilla, other, strict=True)]
    parted = [i for i, first in enumerate(firsts) if first is not None]
    if not parted:
        return []
    rerun = parted if max_tokens is None else list(range(len(chats)))
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=firsts[i] + 1 if max_tokens is None else max_tokens,
            logprobs=2,
        )
        for i in rerun
    ]
    results = llm.chat([chats[i] for i in rerun], params, use_tqdm=False)
    outputs = dict(zip(rerun, results, strict=True))
    return [_parting(i, firsts[i], vanilla[i], outputs[i].outputs[0]) for i in parted]


def _parting(prompt: int, first: int, vanilla: list[int], rerun: Any) -> Parting:
    """The Parting of `prompt` from its rerun (a vLLM CompletionOutput with logprobs)."""
    reproduced = list(rerun.token_ids[: first + 1]) == vanilla[: first + 1]
    known = reproduced and first < len(vanilla) and first < len(rerun.logprobs or [])
    return Parting(prompt, first, top2_gap(rerun.logprobs[first]) if known else None)
