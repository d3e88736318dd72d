"""Which source drafts a request's chain (hybrid/choice.py)."""

from __future__ import annotations

import pytest

from vllm_clover.hybrid.choice import CLOVER, LOOKUP, ChainRates, SourceChoice

pytestmark = pytest.mark.unit


def test_a_chain_is_scored_against_what_the_target_emitted():
    rates = ChainRates(depth=4, prior=0.5)
    assert rates.observe([7, 8, 9], [7, 8, 5]) == 2  # the third rejected (5 came instead)
    assert rates.reached.tolist() == [1, 1, 1, 0] and rates.accepted.tolist() == [1, 1, 0, 0]
    assert rates.observe([7, 8], [7]) == 1  # censored: the target emitted one token only
    assert rates.reached.tolist() == [2, 1, 1, 0]


def test_expected_length_is_a_chain_of_rates():
    rates = ChainRates(depth=3, prior=0.5)
    assert rates.expected(2) == pytest.approx(0.5 + 0.25)
    for _ in range(98):
        rates.observe([1, 2, 3], [1, 2, 3, 4])  # always accepted
    assert rates.rates() == pytest.approx([0.99] * 3)  # (98 + 2 x 0.5) / (98 + 2)
    assert rates.expected(0) == 0


def test_the_docstring_example_and_ties_to_clover():
    """The example of docs/design/drafting.md, "Choosing the source", and ties."""
    choice = SourceChoice(depth=3, max_n=4)
    choice.lookup[3].prior = 0.8
    choice.clover.reached[:2], choice.clover.accepted[:2] = 1000, (500, 300)
    assert choice.choose(3, 3, 2) == LOOKUP  # 1.95 against about 0.65
    assert choice.choose(0, 0, 2) == CLOVER  # no match
    assert choice.choose(3, 0, 0) == CLOVER  # nothing to draft: Clover's (empty) chain
    choice.lookup[1].prior = 0.0  # a match whose chains are never accepted
    assert choice.choose(1, 4, 0) == CLOVER  # worth 0 = Clover's empty chain: a tie
