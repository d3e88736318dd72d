"""CloverProposer's pieces that need no engine: the draft log, the index of each request's
last accepted token, and the drafting subset of a trial."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_clover.integration.proposer import CloverProposer, DraftLog, _last_accepted

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


class RecordingHeads:
    """Heads whose k drafts are t0 + 1 .. t0 + k, drawn through the sampler when given
    (logits over a 3-row draft vocabulary that favour row 1)."""

    def propose(self, h0, t0, k, tables, min_confidence, sampler):
        self.rows, self.sampler = h0.shape[0], sampler
        if sampler is not None:
            for _ in range(k):
                sampler.pick(torch.tensor([[0.0, 2.0, 0.0]]).expand(h0.shape[0], 3))
        return t0[:, None] + torch.arange(1, k + 1)


def trial_proposer(drafting, req_ids="abcd", probabilistic=False) -> CloverProposer:
    proposer = CloverProposer.__new__(CloverProposer)  # no engine: only what drafting reads
    proposer.drafting, proposer.trees, proposer.min_confidence = drafting, None, None
    proposer.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=list(req_ids)))
    proposer.model = SimpleNamespace(
        heads=RecordingHeads(), tables=SimpleNamespace(draft_vocab_ids=torch.tensor([0, 2, 4]))
    )
    proposer.draft_log = DraftLog()
    proposer._enable_probabilistic_draft_probs = probabilistic
    vocab = SimpleNamespace(get_vocab_size=lambda: 5)
    proposer.vllm_config = SimpleNamespace(model_config=vocab)
    return proposer


def test_a_trial_drafts_for_its_subset_and_the_others_get_minus_ones():
    """drafting [d, b] of requests (a, b, c, d): rows (1, 3) draft, the others' rows are
    -1 (the draft_lengths patch cuts them to no drafts); the head loop ran on 2 rows."""
    proposer = trial_proposer(["d", "b"])
    rows = proposer._drafting_rows(4, 2, torch.zeros(1))
    assert rows.tolist() == [1, 3] and proposer.draft_log.subset_steps == 1
    t0 = torch.tensor([10, 20, 30, 40])
    h0 = torch.zeros(2, 8)  # the drafting requests' rows only
    drafts = proposer._draft(h0, t0, 2, SimpleNamespace(all_greedy=True), rows)
    assert drafts.tolist() == [[-1, -1], [21, 22], [-1, -1], [41, 42]]
    assert proposer.model.heads.rows == 2
    assert trial_proposer(None)._drafting_rows(4, 2, t0) is None  # every request drafts
    assert trial_proposer(["a", "b"], "ab")._drafting_rows(2, 2, t0) is None  # all of them
    assert trial_proposer(["a"])._drafting_rows(4, 0, t0) is None  # K = 0 drafts nothing


def test_drawn_drafts_of_a_subset_keep_their_rows_and_generators():
    """T > 0 with drawn drafts: the sampler sees the subset's temperatures and the seeded
    generator of runner row 3 as its row 1; q is scattered back to (num_reqs, k, V), zero
    for the requests that did not draft."""
    proposer = trial_proposer(["b", "d"], probabilistic=True)
    generator = torch.Generator().manual_seed(0)
    metadata = SimpleNamespace(
        all_greedy=False, temperature=torch.tensor([0.0, 1.0, 0.5, 0.7]), generators={3: generator}
    )
    rows = proposer._drafting_rows(4, 1, torch.zeros(1))
    proposer._draft(torch.zeros(2, 8), torch.tensor([1, 2, 3, 4]), 1, metadata, rows)
    sampler = proposer.model.heads.sampler
    assert sampler.temperature.tolist() == pytest.approx([1.0, 0.7])
    assert sampler.generators == {1: generator}
    probs = proposer._last_draft_probs
    assert probs.shape == (4, 1, 5) and probs[[0, 2]].abs().sum() == 0
    assert probs[[1, 3]].sum(dim=-1).flatten().tolist() == pytest.approx([1.0, 1.0])
