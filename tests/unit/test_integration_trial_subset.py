"""TrialSubsets (integration/trial_subset.py): which requests a subset trial drafts for."""

from __future__ import annotations

import pytest

from vllm_clover.integration.trial_subset import TrialSubsets

pytestmark = pytest.mark.unit


def test_the_least_behind_are_picked_as_in_the_docstring_example():
    subsets = TrialSubsets(3)
    subsets.marks = {"a": 118, "b": 250, "d": 60, "e": 496}
    ends = {"a": 120, "b": 300, "c": 90, "d": 64, "e": 500}
    assert subsets.pick(ends) == ["a", "d", "e"]


def test_marks_follow_the_steps_that_drafted_and_forget_finished_requests():
    subsets = TrialSubsets(1)
    subsets.drafted({"a": 10, "b": 12}, None)  # a step that drafted for all
    assert subsets.marks == {"a": 10, "b": 12}
    subsets.drafted({"a": 30, "b": 40}, ["b"])  # a trial for b only
    assert subsets.marks == {"a": 10, "b": 40}
    assert subsets.pick({"a": 41, "b": 44}) == ["b"]  # 4 behind against a's 31
    subsets.forget(["b", "z"])
    assert subsets.marks == {"a": 10}


def test_a_request_that_went_back_past_its_mark_counts_from_the_start():
    """Preempted and resumed, a request computes its prompt again: its rows are behind by its
    whole length, not by a negative count that would put it first."""
    subsets = TrialSubsets(1)
    subsets.marks = {"a": 500, "b": 20}
    assert subsets.behind("a", 64) == 64
    assert subsets.pick({"a": 64, "b": 40}) == ["b"]
