"""CloverProposer's pieces that need no engine: the draft log, the idle steps, the index of
each request's last accepted token, and chains drafted with and without drawn drafts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_clover.core.proposer import CloverProposer, DraftLog, _last_accepted

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
    assert log.cut_short == 2  # the chains of 1 and of 0 drafts, not the full one
    log.record(0, torch.zeros(4, 0, dtype=torch.long), step_tokens=4, cut=True)
    assert log.cut_short == 2  # a K = 0 step has no chain to cut


def test_last_accepted_token_of_each_request():
    metadata = SimpleNamespace(query_start_loc=torch.tensor([0, 3, 4, 9]))
    assert _last_accepted(None, metadata).tolist() == [2, 3, 8]  # last scheduled token
    given = torch.tensor([1, 3, 6])
    assert _last_accepted(given, metadata) is given


def idle_proposer(may_rest=True, hybrid=None) -> SimpleNamespace:
    return SimpleNamespace(
        may_rest=may_rest,
        hybrid=hybrid,
        draft_log=DraftLog(),
        device=torch.device("cpu"),
        stops_early=False,
        num_speculative_tokens=4,
        _last_draft_probs="stale",
    )


def test_only_k_zero_steps_where_the_block_may_rest_are_idle():
    """An idle step returns [num_reqs, 0] drafts and is logged as a K = 0 step, prompt
    chunks or not; a step that drafts, one with the lookup and an engine where the block
    never rests (async scheduling, trees, no block) go to propose."""
    proposer = idle_proposer()
    drafts = CloverProposer.idle_step(proposer, 0, 3, 5)
    assert drafts.shape == (3, 0) and drafts.dtype == torch.int64
    assert proposer.draft_log.idle == 1 and proposer.draft_log.steps_by_k == {0: 1}
    assert proposer.draft_log.max_step_tokens == 5
    assert proposer.num_speculative_tokens == 0 and proposer._last_draft_probs is None
    assert CloverProposer.idle_step(proposer, 2, 3, 5) is None
    assert CloverProposer.idle_step(proposer, 0, 3, 40) is not None  # 37 prompt tokens too
    assert proposer.draft_log.idle == 2 and proposer.draft_log.max_step_tokens == 40
    for other in (idle_proposer(may_rest=False), idle_proposer(hybrid=object())):
        assert CloverProposer.idle_step(other, 0, 3, 3) is None
    assert proposer.draft_log.idle == 2


class RecordingHeads:
    """Heads whose k drafts are t0 + 1 .. t0 + k, drawn through the sampler when given
    (logits over a 3-row draft vocabulary that favour row 1)."""

    def propose(self, h0, t0, k, tables, min_confidence, sampler):
        self.rows, self.sampler = h0.shape[0], sampler
        if sampler is not None:
            for _ in range(k):
                sampler.pick(torch.tensor([[0.0, 2.0, 0.0]]).expand(h0.shape[0], 3))
        return t0[:, None] + torch.arange(1, k + 1)


def chain_proposer(probabilistic=False) -> CloverProposer:
    proposer = CloverProposer.__new__(CloverProposer)  # no engine: only what drafting reads
    proposer.trees, proposer.min_confidence = None, None
    proposer.model = SimpleNamespace(
        heads=RecordingHeads(), tables=SimpleNamespace(draft_vocab_ids=torch.tensor([0, 2, 4]))
    )
    proposer.draft_log = DraftLog()
    proposer._enable_probabilistic_draft_probs = probabilistic
    vocab = SimpleNamespace(get_vocab_size=lambda: 5)
    proposer.vllm_config = SimpleNamespace(model_config=vocab)
    return proposer


def test_a_chain_drafts_k_per_request_and_k0_drafts_nothing():
    proposer = chain_proposer()
    t0 = torch.tensor([10, 20, 30])
    drafts = proposer._draft(torch.zeros(3, 8), t0, 2, SimpleNamespace(all_greedy=True))
    assert drafts.tolist() == [[11, 12], [21, 22], [31, 32]]
    assert proposer.model.heads.sampler is None  # greedy requests: argmax drafts
    assert proposer._draft(torch.zeros(3, 8), t0, 0, None).shape == (3, 0)


def test_drawn_drafts_keep_each_requests_temperature_and_generator():
    """T > 0 with drawn drafts: the sampler sees every request's temperature and the seeded
    generator of runner row 3; q comes back as (num_reqs, k, V) over the target vocabulary."""
    proposer = chain_proposer(probabilistic=True)
    generator = torch.Generator().manual_seed(0)
    metadata = SimpleNamespace(
        all_greedy=False, temperature=torch.tensor([0.0, 1.0, 0.5, 0.7]), generators={3: generator}
    )
    proposer._draft(torch.zeros(4, 8), torch.tensor([1, 2, 3, 4]), 1, metadata)
    sampler = proposer.model.heads.sampler
    assert sampler.temperature[1:].tolist() == pytest.approx([1.0, 0.5, 0.7])  # row 0: greedy
    assert sampler.generators == {3: generator}
    probs = proposer._last_draft_probs
    assert probs.shape == (4, 1, 5)
    assert probs[[1, 2, 3]].sum(dim=-1).flatten().tolist() == pytest.approx([1.0, 1.0, 1.0])
