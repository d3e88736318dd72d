"""Where two greedy runs part and whether it was a rounding tie (bench/ties.py); the rerun in
a real engine is in tests/engine/test_bench_engine.py."""

from types import SimpleNamespace

import pytest

from vllm_clover.bench.ties import (
    NEAR_TIE,
    Parting,
    VanillaRerun,
    first_difference,
    parting,
    top2_gap,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("a", "b", "first"),
    [
        ([5, 9, 2, 7], [5, 9, 4, 1], 2),  # docs/design/engine-layer.md's tie-check example
        ([5, 9, 2], [5, 9, 2], None),  # equal
        ([5, 9], [5, 9, 2], 2),  # one ended (EOS) where the other went on
        ([], [3], 0),
        ([1, 2], [7, 2], 0),
    ],
)
def test_first_difference(a, b, first):
    assert first_difference(a, b) == first
    assert first_difference(b, a) == first


def _logprobs(*values: float) -> dict:
    return {token: SimpleNamespace(logprob=v) for token, v in enumerate(values)}


def test_top2_gap_is_best_minus_second_whatever_the_order():
    assert top2_gap(_logprobs(-0.82, -0.70)) == pytest.approx(0.12)
    assert top2_gap(_logprobs(-3.0, -0.5, -0.5)) == 0.0  # an exact tie
    assert top2_gap(_logprobs(-0.1)) == float("inf")  # one candidate: no tie possible


def test_a_tie_is_a_known_gap_within_the_dtypes_rounding():
    assert Parting(0, 3, 0.0).is_tie("float32")
    assert not Parting(0, 3, 0.125).is_tie("float32")
    assert Parting(0, 3, NEAR_TIE["bfloat16"]).is_tie("bfloat16")
    assert not Parting(0, 3, 0.625).is_tie("bfloat16")
    assert not Parting(0, 3, None).is_tie("bfloat16")  # unknown is not a tie ...
    assert not Parting(0, 3, None).is_bug("bfloat16")  # ... nor a bug
    assert Parting(0, 3, 0.625).is_bug("bfloat16") and not Parting(0, 3, 0.5).is_bug("bfloat16")


def test_parting_reads_the_gap_where_the_rerun_reproduces_vanilla():
    vanilla, other = [5, 9, 2, 7], [5, 9, 4, 1]  # part at index 2
    rerun = VanillaRerun((5, 9, 2), (1.5, 2.0, 0.125))
    assert parting(3, vanilla, other, rerun) == Parting(3, 2, 0.125)
    assert parting(3, vanilla, other, None) == Parting(3, 2, None)  # not rerun
    drifted = VanillaRerun((5, 8, 2), (1.5, 2.0, 0.125))  # its own tokens, not vanilla's
    assert parting(3, vanilla, other, drifted) == Parting(3, 2, None)
    short = VanillaRerun((5, 9), (1.5, 2.0))  # ended before the parting
    assert parting(3, vanilla, other, short) == Parting(3, 2, None)
    with pytest.raises(ValueError, match="prompt 3: the two outputs are equal"):
        parting(3, vanilla, vanilla, rerun)
