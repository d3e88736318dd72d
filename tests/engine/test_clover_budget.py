"""How much Clover drafts under vLLM's scheduler: outputs still equal vanilla decoding
(greedy, float32) while the draft length changes per step and per request.

The cases: steps at K = 0 that defer the Augmenting Block's rows and catch them up (with
subset trials among them), KV blocks filled without drafts that a later request runs, the
default goodput budget with heads whose drafts pay and with heads whose drafts never do,
and the confidence stop's per-request chain lengths. Each runs with each shipped
configuration where it applies and asserts that Clover drafted and drafts were accepted,
besides what the budget chose. The reference is plain vLLM on the same prompts
(scheduling_cases.py).
"""

from collections import Counter

import pytest
from scheduling_cases import MAX_TOKENS, generate
from spec_checks import (
    assert_clover_speculated,
    cut_short,
    goodput_budget,
    script_budget,
    speculation,
    subset_steps,
)

from helpers import in_process_llm, make_untrained_clover
from vllm_clover.bench.measure import metric_total
from vllm_clover.modeling.checkpoint import read_config_json

pytestmark = pytest.mark.engine


def _drafts_and_deferral(worker) -> tuple:
    drafter = worker.model_runner.drafter
    stats = None if drafter.deferral is None else dict(vars(drafter.deferral.stats))
    return list(drafter.draft_log.drafts), stats


def _has_block(spec) -> bool:
    """Whether spec's heads have an Augmenting Block, whose rows steps may defer."""
    config = read_config_json(spec["model"])
    return bool(config.get("use_augmenting_block"))


def _keep_drafts(worker) -> None:
    worker.model_runner.drafter.draft_log.keep_drafts = True


def _table_with_trials(schedule: list[list[int]], every: int):
    """A `script_budget` script: K from `schedule` ([[lo, hi, K], ...] by batch size), but
    every `every`-th step of K = 0 a subset trial of K = 2 for 4 requests."""

    def script(step: int, batch: int) -> tuple[int, int | None]:
        k = next(k for low, high, k in schedule if low <= batch <= high)
        return (2, 4) if k == 0 and step % every == 0 else (k, None)

    return script


def test_steps_without_drafts_defer_the_block_without_changing_a_draft(
    reference_target, clover_spec, scheduling_cases
):
    """A dynamic schedule as above (K = 0 above 4 requests), with a token budget small
    enough that the deferred rows of the requests left must be caught up over several
    passes, and every third step of K = 0 a subset trial (K = 2 for 4 requests, the others'
    rows kept): every draft equals the one drafted with the block run at every step
    (defer_block false), outputs equal vanilla, and the block's rows were deferred, caught
    up in backlog passes and dropped for requests that finished while they waited, and the
    rows of each KV block (32 positions here) parked when the block filled. Heads without
    an Augmenting Block have nothing to defer."""
    prompts, params, expected = scheduling_cases["mixed"]
    k = clover_spec["num_speculative_tokens"]
    schedule = [[1, 2, k], [3, 4, 2], [5, 256, 0]]
    runs = []
    for defer in (None, False):  # the default, then off
        spec = {key: value for key, value in clover_spec.items() if key != "draft_budget"}
        spec["defer_block"] = defer
        with in_process_llm(
            reference_target,
            speculative_config=spec,
            max_num_seqs=16,
            max_num_batched_tokens=32,
            enable_chunked_prefill=True,
            block_size=32,
        ) as llm:
            llm.collective_rpc(_keep_drafts)
            script_budget(llm, _table_with_trials(schedule, every=3))
            outputs = generate(llm, prompts, params)
            ((drafts, deferral),) = llm.collective_rpc(_drafts_and_deferral)
            log = goodput_budget(llm).log
            runs.append((outputs, drafts, deferral, speculation(llm), subset_steps(llm), log))
    (deferred_outputs, deferred_drafts, deferral, stats, subsets, log) = runs[0]
    outputs, drafts, off, _, subsets_off, _ = runs[1]
    assert deferred_outputs == expected == outputs
    assert deferred_drafts == drafts and off is None
    assert subsets == subsets_off == log.subset_steps > 0, log
    assert log.subset_accepted > 0, log  # the target accepted some of the trials' drafts
    assert_clover_speculated(stats)
    assert {0, 2, k} <= set(stats.steps_by_k), stats.steps_by_k
    if not _has_block(clover_spec):
        assert deferral is None
        return
    assert deferral["caught_up"] > 0 and deferral["backlog_passes"] > 0, deferral
    assert deferral["dropped"] > 0 and deferral["deferred"] > deferral["caught_up"], deferral
    assert deferral["parked"] > 0, deferral


def test_blocks_filled_without_drafts_run_for_the_requests_that_share_them(
    reference_target, clover_spec, scheduling_cases
):
    """Two requests with the shared system prompt run together at K = 0 (K = 0 above one
    request) and finish: the rows of their full KV blocks (32 positions) are parked, and
    none runs. Two more with the same system prompt then run one at a time, drafting:
    prefix caching gives them the first two's blocks, and the first runs the rows parked
    there before its own. Drafts equal those with the block run at every step
    (defer_block false), and outputs equal vanilla."""
    prompts, params, expected = scheduling_cases["shared_prefix"]
    k = clover_spec["num_speculative_tokens"]
    assert all(len(tokens) == MAX_TOKENS for tokens, _ in expected[:2])  # they finish together
    runs = []
    for defer in (None, False):  # the default, then off
        spec = {**clover_spec, "num_speculative_tokens_per_batch_size": [[1, 1, k], [2, 8, 0]]}
        spec["defer_block"] = defer
        with in_process_llm(
            reference_target,
            speculative_config=spec,
            max_num_seqs=2,
            block_size=32,
            enable_prefix_caching=True,
        ) as llm:
            llm.collective_rpc(_keep_drafts)
            together = generate(llm, prompts[:2], params[:2])
            ((_, parked),) = llm.collective_rpc(_drafts_and_deferral)
            hits = metric_total(llm, "vllm:prefix_cache_hits")
            alone = [generate(llm, [prompt], params[:1])[0] for prompt in prompts[2:4]]
            hits = metric_total(llm, "vllm:prefix_cache_hits") - hits
            ((drafts, run),) = llm.collective_rpc(_drafts_and_deferral)
            runs.append((together + alone, drafts, parked, run, hits, speculation(llm)))
    (outputs, drafts, parked, run, hits, stats), (outputs_off, drafts_off, *_) = runs
    assert outputs == expected[:4] == outputs_off
    assert drafts == drafts_off
    assert hits >= 2 * 32, hits  # each later request found the system prompt's blocks cached
    assert_clover_speculated(stats)
    assert {0, k} <= set(stats.steps_by_k), stats.steps_by_k
    if not _has_block(spec):  # nothing to park
        assert parked is None
        return
    assert parked["parked"] >= 2 * 32 and parked["caught_up"] == 0, parked  # none ran
    assert run["deferred"] == parked["deferred"], run  # alone, every step drafted
    assert run["caught_up"] >= 32, run  # rows parked by the first two, run by a later one


def _together_then_alone(reference_target, spec, cases, alone: int):
    """One engine with `spec`: the 16 plain prompts at once, then the first `alone` one by
    one. (outputs together, outputs alone, speculation, the controller's log, (the steps
    the proposer drafted for a subset of, the chains the confidence stop cut short), the
    controller's decisions during each request alone as Counters of (batch, K)))."""
    prompts, params, _ = cases["plain"]
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=16) as llm:
        together = generate(llm, prompts, params)
        log, singles, decisions = goodput_budget(llm).log, [], []
        for prompt in prompts[:alone]:
            before = Counter(log.chosen)
            singles.append(generate(llm, [prompt], params[:1])[0])
            decisions.append(log.chosen - before)
        drafter = (subset_steps(llm), cut_short(llm))
        return together, singles, speculation(llm), log, drafter, decisions


# Heads whose drafts pay by a margin that step-time noise cannot hide at batch 1: the reference
# heads run 1.07-1.18x vanilla there (docs/benchmarks.md). Clover-2's do on Zen 4, but drafting
# costs them two decoder layers and the fusion, and on a 2-core Zen 3 (AVX2 only) the controller
# rightly chose K = 0 in all 48 steps alone in one full-suite run. The paper's full configuration
# gains ~4% with K = 1 or 2 on this CPU (its Augmenting Block runs at every step, drafting or
# not), a close call that a slower or busier machine tips to K = 0.
CLEAR_GAIN_ALONE = {"reference"}


def test_goodput_budget_drafts_where_drafts_pay(
    reference_target, clover_spec, scheduling_cases, request
):
    """The default draft budget, in one engine: 16 requests at once, then two alone. Alone,
    where the heads' drafts clearly pay, the controller must draft in most steps; the full
    and Clover-2 configurations' gains there are within step-time noise on some CPUs (in one
    full-suite run the full one chose K = 0 in 155 of 176 steps alone; this test run by
    itself, K > 0 in 153 of 157), so either choice is right for them.
    What it picks under load depends on the machine's costs and the heads' acceptance (the
    benchmarks measure that); here every K it ran keeps outputs equal to vanilla, and one step
    verifies chains shorter than its K (the confidence stop: with heads whose second
    position is rarely right, every chain may stop at length 1, so lengths 1 and 0 are all
    one run shows, and K = 1 is the right choice after the warm-up). Its
    trials under load (the warm-up cycle's at least) draft for 4 of the 16 requests, the
    proposer drafts for those only, and the target accepts some of their drafts."""
    expected = scheduling_cases["plain"][2]
    spec = {key: value for key, value in clover_spec.items() if key != "draft_budget"}
    together, alone, stats, log, (subsets, cut), _ = _together_then_alone(
        reference_target, spec, scheduling_cases, 2
    )
    picks = log.k_by_batch()
    assert together == expected and alone == expected[:2]
    assert subsets == log.subset_steps > 0 and log.subset_accepted > 0, log
    if request.node.callspec.params["shipped_heads"] in CLEAR_GAIN_ALONE:
        assert sum(n for k, n in picks[1].items() if k > 0) > sum(picks[1].values()) / 2, picks
    assert stats.steps_by_k.get(0, 0) > 0 and len(stats.steps_by_k) > 1, stats.steps_by_k
    assert cut > 0, stats  # the confidence stop ended a chain short of its step's K
    assert_clover_speculated(stats)


@pytest.fixture(scope="module")
def useless_heads(reference_target, tmp_path_factory):
    """Untrained heads: the target (almost) never accepts their drafts."""
    return make_untrained_clover(reference_target, tmp_path_factory.mktemp("useless") / "heads")


def test_goodput_budget_stops_drafting_when_drafts_do_not_pay(
    reference_target, useless_heads, scheduling_cases
):
    """With heads whose drafts are (almost) never accepted, every K > 0 costs more than K = 0
    and earns nothing, on any machine: under load of 16 requests, and alone once the first
    request alone has measured that, the controller's own decisions must be K = 0, and
    outputs equal vanilla. The first request alone may still draft: under load only trials
    of 4 requests drafted, and an upper confidence bound on acceptance from the few requests
    they verified (17 in one run: 10 %) is worth the 10-20 % that K = 1 costs alone; each
    step that drafts tightens it."""
    expected = scheduling_cases["plain"][2]
    spec = {"method": "clover", "model": str(useless_heads), "num_speculative_tokens": 4}
    together, alone, stats, log, _, singles = _together_then_alone(
        reference_target, spec, scheduling_cases, 3
    )
    picks = log.k_by_batch()
    assert together == expected and alone == expected[:3]
    assert stats.drafter == "CloverProposer" and stats.drafts > 0, stats  # the warm-up drafted
    loaded = Counter()
    for batch, ks in picks.items():
        if batch >= 8:
            loaded.update(ks)
    assert loaded[0] > 0.8 * sum(loaded.values()), picks  # K = 0 chosen under load
    measured = singles[1] + singles[2]
    assert measured[(1, 0)] > 0.8 * measured.total(), (singles, picks)  # and alone
    assert stats.accepted < 0.1 * stats.draft_tokens, stats  # the premise: drafts do not pay


def test_confidence_stop_drafts_per_request_lengths(
    reference_target, clover_spec, scheduling_cases
):
    """draft_confidence in speculative_config: each request's chain stops at its first
    unsure head, so one step verifies chains of different lengths, 0 included."""
    prompts, params, expected = scheduling_cases["plain"]
    k = clover_spec["num_speculative_tokens"]
    spec = {**clover_spec, "draft_confidence": [0.3] * k}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=16) as llm:
        outputs = generate(llm, prompts, params)
        stats = speculation(llm)
    assert outputs == expected
    lengths = stats.drafts_by_length
    assert lengths.get(0, 0) > 0 and lengths.get(k, 0) > 0, lengths  # stopped and full chains
    assert any(lengths.get(n, 0) > 0 for n in range(1, k)), lengths  # and chains cut midway
    assert_clover_speculated(stats)
    assert stats.draft_tokens < k * stats.drafts  # vLLM verified fewer than k per request
