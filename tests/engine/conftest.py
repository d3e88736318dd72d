"""Fixtures of the engine tests that share one set of vanilla outputs (scheduling_cases.py)."""

import pytest
from scheduling_cases import build_cases

from helpers import fixed_budget_spec


@pytest.fixture(scope="session")
def scheduling_cases(reference_target, mtbench_path):
    """Prompts, params and the vanilla outputs for every case, run once per session."""
    return build_cases(reference_target, mtbench_path)


@pytest.fixture(scope="module")
def clover_spec(shipped_heads):
    """Each shipped configuration at its full K on every step (draft_budget "fixed")."""
    return fixed_budget_spec(shipped_heads)
