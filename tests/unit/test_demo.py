"""What the demo prints about equality (demo.py): ties explained, anything else an error.
The demo end to end is in tests/engine/test_reference_generation.py."""

import pytest

from vllm_clover.bench.measure import Counters, Run
from vllm_clover.bench.ties import Parting
from vllm_clover.demo import report

pytestmark = pytest.mark.unit

VANILLA = Run([[1, 2, 3], [4, 5, 6], [7, 8, 9]], 1.0, Counters())
CLOVER = Run(
    [[1, 2, 3], [4, 0, 0], [7, 8, 0]],
    0.5,
    Counters(drafts=4, draft_tokens=16, accepted=3, accepted_per_pos=(2, 1, 0, 0)),
)


def test_partings_at_ties_are_explained(capsys):
    report(VANILLA, CLOVER, 4, "bfloat16", [Parting(1, 1, 0.0), Parting(2, 2, 0.125)])
    out = capsys.readouterr().out
    assert (
        "outputs: 1/3 token-identical to vanilla; 2 part where vanilla's two best tokens "
        "were a bfloat16 rounding tie (top-2 logit gap 0, 0.125; a tie is <= 0.5"
    ) in out
    assert "tau 1.75 tokens per verification step" in out and "2.00x vanilla" in out
    assert "4.0 drafts per step of at most 4, accepted per position: 0.50 0.25 0.00 0.00" in out


def test_an_unknown_gap_is_said_and_not_an_error(capsys):
    report(VANILLA, CLOVER, 4, "bfloat16", [Parting(1, 1, 0.0), Parting(2, 2, None)])
    out = capsys.readouterr().out
    assert "1 part where vanilla's two best tokens were a bfloat16 rounding tie" in out
    assert "1 part elsewhere (below)" in out
    assert "prompt 2 parts at token 2: vanilla's gap there is unknown" in out


def test_a_run_without_drafts_says_so(capsys):
    report(VANILLA, Run(VANILLA.tokens, 1.0, Counters()), 4, "float32", [])
    out = capsys.readouterr().out
    assert "the draft budget chose not to draft in this run" in out
    assert "outputs: 3/3 token-identical to vanilla" in out


@pytest.mark.parametrize(("dtype", "gap"), [("bfloat16", 1.25), ("float32", 0.125)])
def test_a_parting_beyond_rounding_fails_the_demo_after_the_figures(capsys, dtype, gap):
    with pytest.raises(SystemExit) as failed:
        report(VANILLA, CLOVER, 4, dtype, [Parting(1, 1, 0.0), Parting(2, 2, gap)])
    out = capsys.readouterr().out
    assert f"prompt 2 parts at token 2, top-2 gap {gap:.3g}: NOT a tie" in out
    assert "x vanilla" in out  # the figures came first
    assert "prompt 2 parts from vanilla at token 2" in str(failed.value)
    assert f"more than {dtype} rounding" in str(failed.value)


def test_bad_sizes_are_refused_before_any_engine(capsys):
    from vllm_clover.cli import main

    assert main(["demo", "--num-prompts", "0"]) == 2
    assert "--num-prompts, --max-tokens and --batch-size must be >= 1" in capsys.readouterr().err
