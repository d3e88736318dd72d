"""CloverProposer's pieces that need no engine: the draft log and the index of each
request's last accepted token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_clover.integration.proposer import DraftLog, _last_accepted

pytestmark = pytest.mark.unit


def test_draft_log_counts_steps_by_k_and_keeps_drafts_on_request():
    log = DraftLog()
    log.record(3, torch.zeros(2, 3, dtype=torch.long), step_tokens=8, cut=False)
    log.record(0, torch.zeros(5, 0, dtype=torch.long), step_tokens=300, cut=False)
    assert log.steps_by_k == {3: 1, 0: 1} and log.max_requests == 5 and log.drafts == []
    assert log.max_step_tokens == 300 and log.drafts_by_length == {3: 2, 0: 5}
    log.keep_drafts = True
    log.record(2, torch.tensor([[7, 8]]), step_tokens=3, cut=False)
    assert log.drafts == [[[7, 8]]]


def test_draft_log_counts_the_length_of_cut_chains():
    log = DraftLog()
    log.record(3, torch.tensor([[5, 6, 7], [5, -1, -1], [-1, -1, -1]]), step_tokens=6, cut=True)
    assert log.drafts_by_length == {3: 1, 1: 1, 0: 1} and log.steps_by_k == {3: 1}


def test_last_accepted_token_of_each_request():
    metadata = SimpleNamespace(query_start_loc=torch.tensor([0, 3, 4, 9]))
    assert _last_accepted(None, metadata).tolist() == [2, 3, 8]  # last scheduled token
    given = torch.tensor([1, 3, 6])
    assert _last_accepted(given, metadata) is given
