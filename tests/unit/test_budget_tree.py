"""The tree budget's threshold c / r, c = f'(N) E / T: learned from synthetic step costs,
rising with the load, corrected by the heads' calibration, and fed by the tree verifier's
decoding steps only."""

import pytest
import torch

from vllm_clover.budget.tree import TreeBudget, TreeBudgetConfig
from vllm_clover.tree import TokenTree, TreeVerdict

pytestmark = pytest.mark.unit


def _learned(fixed: float, per_row: float, batch: int, tokens: float, steps: int = 300):
    """A budget fed decoding steps of batch + 0..8 rows costing fixed + per_row * rows."""
    budget = TreeBudget(TreeBudgetConfig())
    for i in range(steps):
        rows = batch + i % 9
        budget.observe_step(fixed + per_row * rows, rows, tokens)
    return budget


def test_the_threshold_is_a_rows_price_in_tokens():
    """Batch 1: 1.5 ms a row, 1.5 tokens a step of ~37.5 ms (40 tokens/s): c = 0.06."""
    budget = _learned(0.030, 0.0015, batch=1, tokens=1.5)
    seconds = budget.seconds / budget.tokens * 1.5  # the learned time of a 1.5-token step
    assert budget.threshold() == pytest.approx(0.0015 * 1.5 / seconds, rel=0.05)
    assert 0.05 < budget.threshold() < 0.07


def test_the_threshold_rises_with_the_load():
    """Batch 16: 1 ms a row, 18 tokens a step of ~80 ms: c ~ 0.22, far above batch 1's."""
    light = _learned(0.030, 0.0015, batch=1, tokens=1.5)
    heavy = _learned(0.060, 0.001, batch=16, tokens=18)
    assert 0.18 < heavy.threshold() < 0.26 and heavy.threshold() > 3 * light.threshold()


def test_calibration_scales_the_threshold_and_the_floor_bounds_it():
    budget = _learned(0.030, 0.0015, batch=1, tokens=1.5)
    before = budget.threshold()
    for _ in range(400):  # the heads' probabilities under-predict: 2 accepted per 1.0
        budget.observe_nodes(1.0, 2)
    assert budget.calibration == pytest.approx(2.0, rel=0.02)
    assert budget.threshold() == pytest.approx(before / budget.calibration, rel=1e-6)
    flat = _learned(0.040, 0.0, batch=1, tokens=1.5)  # rows cost nothing: draft down to the floor
    assert flat.threshold() == TreeBudgetConfig().floor


def test_warmup_and_the_verifier_feeds_decoding_steps_only():
    """Until warmup_steps decoding steps are measured the threshold is `start`. The
    verifier times each step from its start to the next one's, counts its requests plus
    the nodes accepted, and skips steps with a prefill chunk."""
    from vllm_clover.tree.step import TreeVerifier

    tree = TokenTree.parse("[(0,), (1,), (0, 0)]")
    trees = TreeVerifier(tree, budget=TreeBudget(TreeBudgetConfig(warmup_steps=2)))
    assert trees.budget.threshold() == TreeBudgetConfig().start
    trees.begin_step(10.0, rows=40, requests=2, decoding=False)  # a prefill chunk
    trees.begin_step(10.5, rows=5, requests=2, decoding=True)
    verdict = TreeVerdict(torch.tensor([[0, 2], [1, -1]]), torch.zeros(2, 3, dtype=torch.long))
    trees.record(verdict, torch.tensor([[0, 2], [1, -1]]), torch.tensor([[0.5, 0.25], [0.5, 0]]))
    trees.begin_step(10.6, rows=3, requests=2, decoding=True)
    budget = trees.budget
    assert budget.steps == 1 and budget.rows == 5  # the prefill step was not learned from
    assert (budget.seconds, budget.tokens) == pytest.approx((0.1, 2 + 3))
    assert (trees.chance_drafted, trees.chance_accepted) == (1.25, 3)
