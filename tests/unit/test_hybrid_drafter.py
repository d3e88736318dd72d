"""`HybridDrafter` (hybrid/drafter.py) in a stand-in runner: rows chosen per request, what each
source earns, the draft distribution of a lookup row, and the runner's own zeros."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_clover.hybrid.choice import CLOVER, LOOKUP
from vllm_clover.hybrid.drafter import HybridDrafter, LookupConfig, StepTokens

pytestmark = pytest.mark.unit

REPEATED = [5, 9, 2, 7, 5, 9, 2]  # "5 9 2" seen before: the lookup continues with 7 5 9
FRESH = [1, 2, 3, 4]  # nothing repeats


def runner(histories: dict[str, list[int]], scheduled: dict[str, list[int]], drafts):
    ids = list(histories)
    tokens = np.zeros((len(ids), 64), dtype=np.int32)
    for i, req_id in enumerate(ids):
        tokens[i, : len(histories[req_id])] = histories[req_id]
    batch = SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(ids)},
        token_ids_cpu=tokens,
        num_tokens_no_spec=np.array([len(histories[r]) for r in ids]),
        spec_token_ids=[scheduled.get(r, []) for r in ids],
        req_prompt_embeds={},
    )
    return SimpleNamespace(input_batch=batch, requests=dict.fromkeys(ids), _draft_token_ids=drafts)


def test_each_request_gets_the_longer_expected_chain_and_a_one_hot_lookup_row():
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    drafts = torch.tensor([[11, 12, -1], [13, 14, 15]])
    probs = torch.full((2, 3, 20), 0.05)
    hybrid.stash(drafts, probs)
    rows = drafts.tolist()
    hybrid.finish(runner({"a": REPEATED, "b": FRESH}, {}, drafts), rows, ["a", "b"])
    assert rows == [[7, 5, 9], [13, 14, 15]]  # a: the lookup (n = 3); b: Clover's chain
    assert probs[0].sum(-1).tolist() == [1.0, 1.0, 1.0] and probs[0, 1, 5] == 1.0
    assert torch.all(probs[1] == 0.05)  # Clover's drawn rows untouched
    assert hybrid.counts.chains == {LOOKUP: 1, CLOVER: 1}
    assert hybrid.pending["a"].start == len(REPEATED) and hybrid.pending["a"].match == 3


def test_the_next_step_settles_what_each_chain_earned():
    """a's lookup chain [7, 5, 9]: vLLM verified 2 of it, accepted both and emitted 3 tokens;
    b's Clover chain: the target emitted 13 then 99 (the second rejected)."""
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    drafts = torch.tensor([[11, 12, -1], [13, 14, 15]])
    hybrid.stash(drafts, None)
    first = runner({"a": REPEATED, "b": FRESH}, {}, drafts)
    hybrid.finish(first, drafts.tolist(), ["a", "b"])
    later = torch.tensor([[0, 0, 0], [0, 0, 0]])
    hybrid.stash(later, None)
    histories = {"a": REPEATED + [7, 5, 1], "b": FRESH + [13, 99]}
    hybrid.finish(
        runner(histories, {"a": [7, 5], "b": [13, 14, 15]}, later), later.tolist(), ["a", "b"]
    )
    assert hybrid.counts.verified == {LOOKUP: 2, CLOVER: 3}
    assert hybrid.counts.accepted == {LOOKUP: 2, CLOVER: 1}


def test_finished_requests_are_forgotten_and_the_runners_zeros_left_alone():
    hybrid = HybridDrafter(LookupConfig(), depth=3, max_model_len=64)
    drafts = torch.tensor([[11, 12, 13]])
    hybrid.stash(drafts, None)
    hybrid.finish(runner({"a": REPEATED}, {}, drafts), drafts.tolist(), ["a"])
    assert "a" in hybrid.pending
    zeros = torch.zeros(1, 3, dtype=torch.long)  # the runner drafted these, not the proposer
    hybrid.stash(drafts, None)
    rows = zeros.tolist()
    hybrid.finish(runner({"b": REPEATED}, {}, zeros), rows, ["b"])
    assert rows == [[0, 0, 0]] and "a" in hybrid.pending  # untouched, nothing settled
    hybrid.stash(drafts, None)
    hybrid.finish(runner({"b": FRESH}, {}, drafts), [[11, 12, 13]], ["b"])
    assert "a" not in hybrid.pending  # a finished: its chain is dropped


def _step(rows: list[list[int]], accepted: list[int], t0: list[int]) -> StepTokens:
    """A decode step: each request scheduled its history's last token and its drafts
    (`rows`), of which the first `accepted` were accepted; then t0."""
    starts = np.cumsum([0] + [len(r) for r in rows[:-1]])
    lasts = starts + np.array(accepted)
    tokens = np.array([t for r in rows for t in r])
    return StepTokens(tokens, starts, lasts, np.array(t0))


def test_the_head_loop_is_skipped_only_where_every_request_takes_the_lookup():
    """a's history after the step: REPEATED[:-2] + the accepted draft 9 + t0 2 = REPEATED, a
    3-token match; b's: FRESH, no match; a prefill chunk (first scheduled token not its
    history's last) always runs the heads."""
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    before = runner({"a": REPEATED[:-2], "b": FRESH[:-1]}, {}, None).input_batch
    only_a = runner({"a": REPEATED[:-2]}, {}, None).input_batch
    step_a = _step([[REPEATED[-3], 9, 44]], accepted=[1], t0=[2])
    assert hybrid.lookup_takes_all(only_a, step_a, k=3)
    assert not hybrid.lookup_takes_all(only_a, step_a, k=0)  # nothing to draft: no skip
    both = _step([[REPEATED[-3], 9, 44], [FRESH[-2]]], accepted=[1, 0], t0=[2, FRESH[-1]])
    assert not hybrid.lookup_takes_all(before, both, k=3)
    chunk = _step([[1, 1, 9]], accepted=[2], t0=[2])
    assert not hybrid.lookup_takes_all(only_a, chunk, k=3)
    assert hybrid.counts.lookup_only_steps == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (False, None), (True, LookupConfig()), ({"min_n": 3}, LookupConfig(3, 4))],
)
def test_the_lookup_setting(value, expected):
    assert LookupConfig.of(value) == expected


@pytest.mark.parametrize(("value", "message"), [({"n": 2}, "not n"), ({"min_n": 5}, "min_n")])
def test_a_bad_lookup_setting_names_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        LookupConfig.of(value)
