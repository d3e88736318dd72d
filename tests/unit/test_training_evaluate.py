"""Offline evaluation: chain acceptance from teacher-forced predictions (worked examples)."""

from __future__ import annotations

import pytest
import torch

from vllm_clover.training.data import Batch
from vllm_clover.training.evaluate import EvalResult, chain_hits, decode_steps, format_table
from vllm_clover.training.loss import HeadStats, graded_positions

pytestmark = pytest.mark.unit

D, K = 16, 3


def chain_batch(x: list[int], top1: list[int]) -> Batch:
    t = len(x)
    return Batch(
        torch.tensor([x]),
        torch.ones(1, t, dtype=torch.bool),
        torch.ones(1, t, dtype=torch.bool),
        torch.zeros(1, t, D),
        torch.tensor([top1]),
    )


def chain_acceptance(preds, tokens, valid, batch) -> tuple[int, int]:
    """(starts, accepted drafts summed over them), as EvalResult counts them."""
    start, ok = chain_hits(preds, tokens, valid, batch)
    return int(start.sum()), int(ok[start].long().cumprod(dim=-1).sum())


def test_chain_acceptance_worked_example() -> None:
    """K = 3, T = 8, greedy self-distilled data (target argmax at t is x_{t+1})."""
    x = [5, 6, 7, 8, 9, 10, 11, 12]
    batch = chain_batch(x, x[1:] + [0])
    tokens, valid = graded_positions(batch, K)
    perfect = torch.where(valid, tokens.target_ids, -1)  # every draft = x_{t+2+i}
    # starts t = 0..5; accepted 3,3,3,3 (t <= 3), 2 (t = 4), 1 (t = 5) -> 15
    assert chain_acceptance(perfect, tokens, valid, batch) == (6, 15)
    wrong = perfect.clone()
    wrong[0, 0, 1] = 0  # head 1 wrong at t = 0: the chain stops after 1 there
    assert chain_acceptance(wrong, tokens, valid, batch) == (6, 13)
    disagree = chain_batch(x, x[1:3] + [99] + x[4:] + [0])  # target argmax at t=2 is not x_3
    # t = 2 is no start (t0 != x_3); a draft of x_3 is rejected (t = 1 head 0, t = 0 head 1)
    assert chain_acceptance(perfect, tokens, valid, disagree) == (5, 1 + 0 + 3 + 2 + 1)


def test_decode_steps_skip_the_positions_an_accepted_run_covers() -> None:
    """The decode-steps worked example of docs/design/training-internals.md, "Offline
    evaluation": steps at t = 0 and 2 only, step tau 3.0 against 3.17."""
    runs = [1, 3, 3, 3, 2, 1]  # accepted drafts of a step started at t = 0..5
    ok = torch.tensor([[i < a for i in range(K)] for a in runs])  # (6, K)
    ok[0, 2] = True  # a hit after a miss is never accepted
    start, domain = torch.ones(6, dtype=torch.bool), torch.ones(6, dtype=torch.bool)
    steps = decode_steps(start, ok, domain)
    assert steps.tolist() == [ok[0].tolist(), ok[2].tolist()]
    result = EvalResult(HeadStats.zeros(K), ok, torch.zeros(6, K), steps).summary()
    assert result["tau"] == pytest.approx(1 + 13 / 6)
    assert result["decode_steps"] == 2
    assert result["step_acceptance"] == [1.0, 0.5, 0.5]
    assert result["step_tau"] == pytest.approx(3.0)
    # a position where the target leaves the data accepts nothing; decoding moves on by one
    start[2] = False  # t = 0 (1) -> t = 2 (0) -> t = 3 (3) -> t = 7
    assert decode_steps(start, ok, domain).long().cumprod(-1).sum(-1).tolist() == [1, 0, 3]
    # steps begin only inside the domain (t0 an answer token)
    domain[:4] = False  # t = 4 (2) -> t = 7
    assert decode_steps(torch.ones(6, dtype=torch.bool), ok, domain).tolist() == [ok[4].tolist()]


def test_format_table_one_row_per_model() -> None:
    result = {
        "top1": [0.5, 0.25],
        "top5": [0.75, 0.5],
        "expected_accepted": 0.6,
        "tau": 1.6,
        "step_tau": 1.5,
    }
    table = format_table({"a": result, "b": {**result, "top1": [0.5], "top5": [0.75]}})
    lines = table.splitlines()
    assert lines[0] == "| model | h0 top1/top5 | h1 top1/top5 | E[accepted] | tau | step tau |"
    assert lines[2] == "| a | 0.500/0.750 | 0.250/0.500 | 0.600 | 1.600 | 1.500 |"
    assert lines[3] == "| b | 0.500/0.750 | - | 0.600 | 1.600 | 1.500 |"
