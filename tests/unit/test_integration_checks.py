"""Start-up checks of a Clover speculative_config: the draft-confidence setting."""

from __future__ import annotations

import pytest

from helpers import tiny_config
from vllm_clover.integration.checks import resolve_draft_budget, resolve_draft_confidence
from vllm_clover.modeling.checkpoint import CloverCheckpointError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("shipped", "override", "used"),
    [
        (None, None, None),  # neither: fixed-length chains
        ([0.1, 0.2, 0.3], None, [0.1, 0.2, 0.3]),  # the checkpoint's
        ([0.1, 0.2, 0.3], 0.25, [0.25, 0.25, 0.25]),  # one number for every head
        (None, [0.5, 0, 0.5], [0.5, 0.0, 0.5]),  # one per head
        ([0.1, 0.2, 0.3], 0, None),  # 0 turns the checkpoint's off
    ],
)
def test_override_beats_checkpoint(shipped, override, used) -> None:
    config = tiny_config(use_augmenting_block=False, num_heads=3, draft_confidence=shipped)
    assert resolve_draft_confidence(override, config) == used


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ([0.1, 0.2], "needs one threshold per head \\(3\\), got 2"),
        ([0.1, 0.2, 1.5], "thresholds are probabilities in \\[0, 1\\]"),
        ("high", "must be a list of numbers"),
        ([0.1, True, 0.2], "must be a list of numbers"),
    ],
)
def test_a_bad_setting_names_the_problem(override, message) -> None:
    config = tiny_config(use_augmenting_block=False, num_heads=3)
    with pytest.raises(CloverCheckpointError, match=f"draft_confidence {message}"):
        resolve_draft_confidence(override, config)


@pytest.mark.parametrize(
    ("budget", "schedule", "used"),
    [
        (None, None, "goodput"),  # the default
        (None, [[1, 4, 2], [5, 64, 0]], "fixed"),  # a hand-written table is vLLM's, as given
        ("fixed", None, "fixed"),
        ("goodput", None, "goodput"),
    ],
)
def test_draft_budget_defaults_to_goodput_unless_a_table_is_given(budget, schedule, used):
    assert resolve_draft_budget(budget, schedule) == used


def test_goodput_with_a_table_names_the_conflict():
    with pytest.raises(CloverCheckpointError, match="num_speculative_tokens_per_batch_size"):
        resolve_draft_budget("goodput", [[1, 64, 2]])
