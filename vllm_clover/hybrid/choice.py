"""Which source drafts a request's chain this step: the one with the longer expected accepted
chain, from how often each source's drafts were accepted so far.

The choice reads only the history's match, the candidates' lengths and these rates, never a
drawn token: looking at Clover's drawn drafts would change their distribution, and vLLM's
verification of them would no longer be exact at T > 0.
How it works: docs/design/drafting.md, "Choosing the source".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LOOKUP, CLOVER = "lookup", "clover"
PRIOR_WEIGHT = 2.0  # chains' worth of prior in each position's rate


class ChainRates:
    """Per-position acceptance of one source's chains (reached and accepted counts)."""

    def __init__(self, depth: int, prior: float) -> None:
        self.reached = np.zeros(depth)
        self.accepted = np.zeros(depth)
        self.prior = prior

    def rates(self) -> np.ndarray:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.reached + PRIOR_WEIGHT)

    def expected(self, length: int) -> float:
        """Expected accepted drafts of a chain of `length`."""
        return float(np.cumprod(self.rates()[:length]).sum())

    def observe(self, drafted: Sequence[int], emitted: Sequence[int]) -> int:
        """Score a chain against the tokens the target emitted after it (at most one more
        than it accepted); returns how many of its drafts were accepted."""
        accepted = 0
        for draft, token in zip(drafted[: len(self.reached)], emitted, strict=False):
            self.reached[accepted] += 1
            if draft != token:
                break
            self.accepted[accepted] += 1
            accepted += 1
        return accepted


class SourceChoice:
    """Rates of both sources, and the choice between them."""

    def __init__(self, depth: int, max_n: int) -> None:
        self.clover = ChainRates(depth, prior=0.4)
        # a longer match is the likelier repetition: priors 0.5 at n = 1 up to 0.8
        self.lookup = {
            n: ChainRates(depth, prior=min(0.8, 0.4 + 0.1 * n)) for n in range(1, max_n + 1)
        }

    def choose(self, match: int, lookup_length: int, clover_length: int) -> str:
        """LOOKUP where a match's chain is worth more than Clover's; CLOVER on ties."""
        if not match or not lookup_length:
            return CLOVER
        worth = self.lookup[match].expected(lookup_length)
        return LOOKUP if worth > self.clover.expected(clover_length) else CLOVER
