"""Where two greedy runs part, and whether vanilla's two best tokens were a rounding tie there
(rounding in bfloat16) or vanilla's best token clearly led (a bug). Why, with a worked
example: docs/design/engine-layer.md, "The tie check"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Top-2 logit gaps within rounding: float32 up to accumulation order; bfloat16 up to four bf16
# steps at the reference target's logit magnitudes (docs/design/engine-layer.md).
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


def rounding_bug(dtype: str, where: str) -> str:
    """The error for partings beyond `dtype`'s rounding, `where` they were (in words), as
    the demo and the bench report it."""
    return (
        "greedy output parted from vanilla's where vanilla's best token led by more than "
        f"{dtype} rounding ({NEAR_TIE[dtype]}): {where}. Speculative decoding "
        "must not change greedy outputs: please report this with the command you ran."
    )


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


@dataclass(frozen=True)
class VanillaRerun:
    """One chat's greedy rerun in a vanilla engine: its tokens, and at each the top-2 logprob
    gap of vanilla's distribution there (plain data: it crosses process boundaries)."""

    tokens: tuple[int, ...]
    gaps: tuple[float, ...]


def rerun_vanilla(
    llm: Any,
    chats: list,
    lengths: dict[int, int],
    max_tokens: int | None = None,
    ignore_eos: bool = False,
) -> dict[int, VanillaRerun]:
    """Greedy reruns with two logprobs per position in `llm` (vanilla), by chat index: with
    `max_tokens` None the chats in `lengths`, each up to its length (batch size 1); else
    every chat with the run's `max_tokens` and `ignore_eos`, as a larger batch ran it
    (docs/design/engine-layer.md, "The tie check")."""
    from vllm import SamplingParams

    rerun = sorted(lengths) if max_tokens is None else list(range(len(chats)))
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=lengths[i] if max_tokens is None else max_tokens,
            logprobs=2,
            ignore_eos=ignore_eos,
        )
        for i in rerun
    ]
    results = llm.chat([chats[i] for i in rerun], params, use_tqdm=False)
    return {
        i: VanillaRerun(
            tuple(out.token_ids), tuple(top2_gap(position) for position in out.logprobs or [])
        )
        for i, out in ((i, result.outputs[0]) for i, result in zip(rerun, results, strict=True))
    }


def parting(
    prompt: int, vanilla: list[int], other: list[int], rerun: VanillaRerun | None
) -> Parting:
    """Where `other` parts from `vanilla` (which must differ), with the gap `rerun` gives
    there; None where there is no rerun, or it does not reproduce vanilla's tokens up to
    and including the parting, or it ended before it."""
    first = first_difference(vanilla, other)
    if first is None:
        raise ValueError(f"prompt {prompt}: the two outputs are equal, they do not part")
    known = (
        rerun is not None
        and list(rerun.tokens[: first + 1]) == list(vanilla[: first + 1])
        and first < min(len(vanilla), len(rerun.gaps))
    )
    return Parting(prompt, first, rerun.gaps[first] if known else None)


def vanilla_partings(
    llm: Any,
    chats: list,
    vanilla: list[list[int]],
    other: list[list[int]],
    max_tokens: int | None = None,
) -> list[Parting]:
    """Each prompt whose `other` output differs from `vanilla`, with vanilla's top-2 gap at
    the first differing token, from `rerun_vanilla` in `llm` (each parted chat up to that
    token with `max_tokens` None; see there for batch sizes above 1)."""
    firsts = {
        i: first_difference(a, b) for i, (a, b) in enumerate(zip(vanilla, other, strict=True))
    }
    lengths = {i: first + 1 for i, first in firsts.items() if first is not None}
    if not lengths:
        return []
    reruns = rerun_vanilla(llm, chats, lengths, max_tokens)
    return [parting(i, vanilla[i], other[i], reruns[i]) for i in sorted(lengths)]
