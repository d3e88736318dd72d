"""`HybridDrafter` (hybrid/drafter.py) on a stand-in input batch: each request's history
rebuilt the same before and after vLLM's bookkeeping, rows chosen per request, what each
source earns, the draft distribution of a lookup row, the head-loop skip, prefill chunks."""

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
ORDERS = ["before", "after"]  # the proposer runs before vLLM's bookkeeping, or after it


def decode(requests: dict[str, tuple[list[int], list[int], int, int]], order: str):
    """(batch, StepTokens) of a decode step. Per request: (history before the step, ending
    with the token it scheduled first; the drafts it verified; how many were accepted; t0)."""
    ids = list(requests)
    token_ids = np.zeros((len(ids), 64), dtype=np.int64)
    known, spans, lasts, positions = [], [], [], []
    for i, (before, drafts, accepted, t0) in enumerate(requests.values()):
        after = before + drafts[:accepted] + [t0]
        history = before + drafts if order == "before" else after  # drafts: placeholders
        token_ids[i, : len(history)] = history
        known.append(len(before) if order == "before" else len(after))
        span = [before[-1]] + (drafts if order == "before" else drafts[:accepted])
        lasts.append(sum(map(len, spans)) + accepted)
        spans.append(span)
        positions.append(len(before) - 1)
    batch = SimpleNamespace(
        req_ids=ids,
        token_ids_cpu=token_ids,
        num_tokens_no_spec=np.array(known),
        num_prompt_tokens=np.ones(len(ids), dtype=np.int64),
        spec_token_ids=[r[1] for r in requests.values()],
        req_prompt_embeds={},
    )
    starts = np.cumsum([0] + [len(s) for s in spans[:-1]])
    tokens = np.array([t for s in spans for t in s])
    t0 = np.array([r[3] for r in requests.values()])
    return batch, StepTokens(tokens, starts, np.array(lasts), np.array(positions), t0)


@pytest.mark.parametrize("order", ORDERS)
def test_each_request_gets_the_longer_expected_chain_and_a_one_hot_lookup_row(order):
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    batch, step = decode({"a": (REPEATED[:-1], [], 0, 2), "b": (FRESH[:-1], [], 0, 4)}, order)
    lookups = hybrid.plan(batch, step, k=3)
    assert lookups[0].candidate == [7, 5, 9] and lookups[0].match == 3
    assert lookups[1].match == 0
    assert not hybrid.takes_all(lookups, k=3)
    drafts = torch.tensor([[11, 12, -1], [13, 14, 15]])
    probs = torch.full((2, 3, 20), 0.05)
    hybrid.choose(lookups, drafts, probs)
    assert drafts.tolist() == [[7, 5, 9], [13, 14, 15]]  # a: the lookup; b: Clover's chain
    assert probs[0].sum(-1).tolist() == [1.0, 1.0, 1.0] and probs[0, 1, 5] == 1.0
    assert torch.all(probs[1] == 0.05)  # Clover's drawn rows untouched
    assert hybrid.counts.chains == {LOOKUP: 1, CLOVER: 1}
    assert hybrid.pending["a"].start == len(REPEATED) and hybrid.pending["a"].match == 3


@pytest.mark.parametrize("order", ORDERS)
def test_the_next_step_settles_what_each_chain_earned(order):
    """a's lookup chain [7, 5, 9]: vLLM verified 2 of it, accepted both and emitted 1 more;
    b's Clover chain [13, 14, 15]: the target emitted 13 then 99 (the second rejected)."""
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    batch, step = decode({"a": (REPEATED[:-1], [], 0, 2), "b": (FRESH[:-1], [], 0, 4)}, order)
    lookups = hybrid.plan(batch, step, k=3)
    hybrid.choose(lookups, torch.tensor([[11, 12, -1], [13, 14, 15]]), None)
    steps = {"a": (REPEATED, [7, 5], 2, 1), "b": (FRESH, [13, 14, 15], 1, 99)}
    lookups = hybrid.plan(*decode(steps, order), k=3)
    assert hybrid.counts.verified == {LOOKUP: 2, CLOVER: 3}
    assert hybrid.counts.accepted == {LOOKUP: 2, CLOVER: 1}
    assert lookups[0].start == len(REPEATED) + 3  # a's history: + 7 5 1


def test_a_step_that_drafts_nothing_still_settles_the_chains_it_verified():
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    batch, step = decode({"a": (REPEATED[:-1], [], 0, 2)}, "before")
    hybrid.choose(hybrid.plan(batch, step, k=3), torch.tensor([[11, 12, 13]]), None)
    lookups = hybrid.plan(*decode({"a": (REPEATED, [7, 5, 9], 3, 4)}, "before"), k=0)
    hybrid.choose(lookups, torch.zeros((1, 0), dtype=torch.long), None)
    assert hybrid.counts.verified == {LOOKUP: 3} and hybrid.counts.accepted == {LOOKUP: 3}
    assert hybrid.pending == {}  # nothing drafted: nothing to settle next


def test_requests_gone_and_chains_not_verified_are_dropped_unscored():
    hybrid = HybridDrafter(LookupConfig(), depth=3, max_model_len=64)
    batch, step = decode({"a": (REPEATED[:-1], [], 0, 2), "b": (FRESH[:-1], [], 0, 4)}, "before")
    hybrid.choose(hybrid.plan(batch, step, k=3), torch.tensor([[11, 12, 13]] * 2), None)
    assert set(hybrid.pending) == {"a", "b"}
    # a left the batch; b's step starts past where its chain was drafted (the runner
    # drafted zeros for it in between): nothing is scored
    batch, step = decode({"b": (FRESH + [13, 6], [0, 0, 0], 0, 8)}, "before")
    hybrid.plan(batch, step, k=3)
    assert hybrid.pending == {} and hybrid.counts.verified == {}


def test_the_head_loop_is_skipped_only_where_every_request_takes_the_lookup():
    """a's history after the step: REPEATED[:-2] + the accepted draft 9 + t0 2 = REPEATED, a
    3-token match; b's: FRESH, no match."""
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    only_a = decode({"a": (REPEATED[:-2], [9, 44], 1, 2)}, "before")
    assert hybrid.takes_all(hybrid.plan(*only_a, k=3), k=3)
    assert not hybrid.takes_all(hybrid.plan(*only_a, k=0), k=0)  # nothing to draft: no skip
    both = decode({"a": (REPEATED[:-2], [9, 44], 1, 2), "b": (FRESH[:-1], [], 0, 4)}, "before")
    assert not hybrid.takes_all(hybrid.plan(*both, k=3), k=3)
    assert hybrid.counts.lookup_only_steps == 1


def test_a_prefill_chunk_with_prompt_still_to_come_is_left_to_the_heads():
    """A 10-token prompt whose first chunk is 6 tokens: the drafts of that step are
    discarded, the lookup does not read it; the last chunk's history is the prompt and t0."""
    prompt = REPEATED + [7, 5, 9]
    hybrid = HybridDrafter(LookupConfig(min_n=2, max_n=3), depth=3, max_model_len=64)
    batch = SimpleNamespace(
        req_ids=["a"],
        token_ids_cpu=np.array([prompt + [0] * 54]),
        num_tokens_no_spec=np.array([len(prompt)]),
        num_prompt_tokens=np.array([len(prompt)]),
        spec_token_ids=[[]],
        req_prompt_embeds={},
    )
    chunk = StepTokens(np.array(prompt[:6]), np.array([0]), np.array([5]), np.array([0]), [3])
    assert hybrid.plan(batch, chunk, k=3) == [None]
    rest = StepTokens(np.array(prompt[6:]), np.array([0]), np.array([3]), np.array([6]), [2])
    (lookup,) = hybrid.plan(batch, rest, k=3)
    assert lookup.start == len(prompt) + 1 and lookup.candidate == [7, 5, 9]
    # both chunks carry prompt tokens (the block may not rest there); a decode step does not
    assert chunk.carries_prompt(batch) and rest.carries_prompt(batch)
    decode_batch, decode_step = decode({"a": (REPEATED[:-2], [9, 44], 1, 2)}, "before")
    assert not decode_step.carries_prompt(decode_batch)


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
