"""GoodputController: the acceptance counters and the K they choose with the step-cost fit
(``test_step_cost.py``), on simulated engines whose true costs and acceptance
are known."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from vllm_clover.budget.goodput import (
    AcceptanceModel,
    GoodputConfig,
    GoodputController,
    _warmup_k,
    batch_bucket,
)

pytestmark = pytest.mark.unit


def cpu_like_step(tokens: float, k: int, batch: int) -> float:
    """A step that is memory-bound up to 8 tokens, then compute-bound; 3 ms + 0.1 ms per
    request for each head step, 1 ms to start drafting at all."""
    forward = 0.030 + 0.0025 * max(0.0, tokens - 8)
    return forward + (0.001 if k else 0.0) + k * (0.003 + 0.0001 * batch)


def simulate(controller, acceptance, step_time, batches, steps=800, seed=0, noise=0.03):
    """Run the controller on a simulated engine: each step, every request verifies the
    drafts made under the previous K (drafting all, accepting a prefix with the given
    per-position conditional acceptance), and the step takes step_time * (1 +- noise)."""
    rng = random.Random(seed)
    k_prev = controller.config.max_k
    for step in range(steps):
        batch = batches[step % len(batches)]
        k = controller.choose(batch)
        verified, tokens = [], batch
        for _ in range(batch):
            accepted = 0
            while accepted < k_prev and rng.random() < acceptance[accepted]:
                accepted += 1
            verified.append((k_prev, accepted))
            tokens += k_prev
        seconds = step_time(tokens, k, batch) * (1 + noise * (2 * rng.random() - 1))
        controller.observe_step(seconds, tokens, k, batch, verified)
        k_prev = k
    return controller


def warm_up(controller: GoodputController) -> None:
    """One decode step of batch 1 at the warm-up's K = max_k (the tests below set
    warmup_steps=1), so that no K of the batch sizes they test is measured."""
    k = controller.choose(1)
    controller.observe_step(0.05, 1, k, 1, [(0, 0)])


def test_warmup_visits_every_k_extremes_first():
    assert [_warmup_k(s, 4) for s in range(6)] == [4, 0, 0, 3, 1, 2]
    assert sorted(_warmup_k(s, 3) for s in range(5)) == [0, 0, 1, 2, 3]
    assert [_warmup_k(s, 1) for s in range(3)] == [1, 0, 0]


def test_large_batches_warm_up_with_k_one():
    """A step verifying K drafts per request costs K + 1 decode steps where the target is
    compute-bound: at batch 64 the cycle is K = 1, 0, 0, where batch 1 tries every K."""
    config = GoodputConfig(max_k=4)
    assert [config.warmup_top(b) for b in (1, 2, 4, 5, 8, 64)] == [4, 4, 3, 2, 1, 1]
    for batch, cycle in ((64, [1, 0, 0]), (1, [4, 0, 0, 3, 1, 2])):
        controller = GoodputController(config)
        picks = []
        for _ in range(len(cycle)):
            picks.append(controller.choose(batch))
            controller.observe_step(0.05, batch, picks[-1], batch, [(0, 0)] * batch)
        assert picks == cycle and sum(controller.log.warmup.values()) == len(cycle)


def test_warmup_advances_on_decode_steps_only():
    """A fresh engine's first steps only prefill: they verify nothing and measure no K, so
    the cycle waits for the first step that decodes; its second K = 0 step is the first to
    neither verify nor draft."""
    controller = GoodputController(GoodputConfig(max_k=2))
    picks = []
    for verified in ([], [], [(0, 0)] * 4, [(2, 1)] * 4, [(0, 0)] * 4, [(0, 0)] * 4):
        picks.append(controller.choose(4))
        tokens = 4 + sum(n for n, _ in verified)
        controller.observe_step(0.05, tokens, picks[-1], 4, verified)
    assert picks == [2, 2, 2, 0, 0, 1]
    assert sum(controller.log.warmup.values()) == 6 and controller.decode_steps == 4


def test_acceptance_counts_follow_the_docstring_example():
    """The counts example of docs/design/drafting.md, "Acceptance as a chain"."""
    model = AcceptanceModel(GoodputConfig(max_k=3, acceptance_memory=1.0))
    for counts in (model.offered, model.drafted, model.reached, model.accepted):
        counts[:] = 0  # no prior
    model.observe([(3, 2, 1)])
    assert model.offered.tolist() == [1, 1, 1]
    assert model.drafted.tolist() == [1, 1, 0]
    assert model.accepted.tolist() == [1, 0, 0]
    assert model.reached.tolist() == [1, 1, 0]


def test_speculates_at_batch_one_and_not_at_batch_64_on_a_cpu_like_engine():
    controller = GoodputController(GoodputConfig(max_k=4, max_tokens=2048))
    simulate(controller, (0.35, 0.25, 0.2, 0.15), cpu_like_step, [1, 2, 4, 16, 64])
    assert controller.best_k(1) >= 1
    assert controller.best_k(64) == 0
    picked = controller.log.k_by_batch()
    assert picked[64].get(0, 0) > 0.9 * sum(picked[64].values())
    # the cycle's length follows the batch: 6 steps at batch 1, 3 at 16; here it ends at
    # the first step of batch 16, the fourth
    assert controller.log.explored and sum(controller.log.warmup.values()) == 4
    best = {k for _, k in controller.log.chosen}
    assert all(any(abs(k - b) == 1 for b in best) for k in controller.log.explored)


def test_chosen_k_is_the_best_k_of_the_true_costs():
    """The controller's pick earns at least 97% of the goodput of the best fixed K, per
    batch size, evaluated with the simulator's true costs and acceptance."""
    acceptance = (0.6, 0.5, 0.4, 0.3)
    controller = GoodputController(GoodputConfig(max_k=4, max_tokens=2048))
    simulate(controller, acceptance, cpu_like_step, [1, 2, 4, 8, 16, 32], steps=1200)
    survive = np.cumprod(acceptance)  # P(first i+1 drafts accepted)
    for batch in (1, 4, 16, 32):
        true = [
            batch * (1 + survive[:k].sum()) / cpu_like_step(batch * (1 + k), k, batch)
            for k in range(5)
        ]
        assert true[controller.best_k(batch)] >= 0.97 * max(true), (batch, true)


def test_never_drafts_when_drafts_are_never_accepted():
    controller = GoodputController(GoodputConfig(max_k=3, max_tokens=512))
    simulate(controller, (0.0, 0.0, 0.0), cpu_like_step, [1, 4])
    assert controller.best_k(1) == controller.best_k(4) == 0


def test_says_once_per_batch_bucket_where_drafting_does_not_pay():
    """Batch 64 settles on K = 0 and is named once, however long it runs; batch 1, where
    the heads pay, is never named."""
    controller = GoodputController(GoodputConfig(max_k=4, max_tokens=2048))
    simulate(controller, (0.35, 0.25, 0.2, 0.15), cpu_like_step, [1, 64], steps=600)
    assert controller.notices == [
        "drafting does not pay at 33-64 requests a step on this machine with these heads "
        "(K = 0 for 64 steps in a row); the budget drafts there only to re-check now and then"
    ]
    controller.notices.clear()
    simulate(controller, (0.35, 0.25, 0.2, 0.15), cpu_like_step, [1, 64], steps=600, seed=1)
    assert controller.notices == []


def test_exploration_rate_and_reproducibility():
    runs = [
        simulate(
            GoodputController(GoodputConfig(max_k=2, max_tokens=64, seed=7)),
            (0.5, 0.5),
            cpu_like_step,
            [2],
            steps=400,
        )
        for _ in range(2)
    ]
    assert runs[0].log == runs[1].log  # same seed, same decisions
    explored = sum(runs[0].log.explored.values())
    assert 0.02 * 397 < explored < 0.12 * 397  # about 1 in 16 after the 3 warm-up steps


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="max_k"):
        GoodputConfig(max_k=0)
    with pytest.raises(ValueError, match="explore"):
        GoodputConfig(max_k=2, explore=1.0)


def test_explores_a_neighbour_only_when_it_is_a_close_call(monkeypatch):
    """K = 1 predicted at 95% of the best K = 0 is tried about one step in 16 (it is the only
    neighbour of 0); predicted at 85% or 50%, never (once measured: min_measured 0 here)."""
    cases = ([1.0, 0.95, 0.2], (40, 90)), ([1.0, 0.85, 0.2], (0, 0)), ([1.0, 0.5, 0.2], (0, 0))
    for predicted, expected in cases:
        config = GoodputConfig(max_k=2, warmup_steps=1, seed=3, min_measured=0)
        controller = GoodputController(config)
        monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_, p=predicted: np.array(p))
        warm_up(controller)
        picks = [controller.choose(8) for _ in range(1000)]
        low, high = expected
        assert low <= picks.count(1) <= high, picks.count(1)
        assert picks.count(2) == 0 and picks.count(0) == 1000 - picks.count(1)


def test_a_step_that_carries_prompt_tokens_never_explores(monkeypatch):
    """The close call of the test above (K = 1 at 95% of K = 0, batch 8), on steps that
    carry prompt tokens: K = 0 every time, though exploration would try K = 1 about one step
    in 16 (drafting there runs the Augmenting Block over the prompt); the decode steps
    around them still explore, and an unmeasured K's burst waits for them."""
    config = GoodputConfig(max_k=2, warmup_steps=1, seed=3, min_measured=0)
    controller = GoodputController(config)
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.95, 0.2]))
    warm_up(controller)
    assert [controller.choose(8, prefill=True) for _ in range(1000)] == [0] * 1000
    assert 40 <= [controller.choose(8) for _ in range(1000)].count(1) <= 90
    unmeasured = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(unmeasured, "predicted_goodput", lambda b, *_: np.array([1.0, 0.9, 0.2]))
    warm_up(unmeasured)
    picks = [unmeasured.choose(8)]
    while picks[-1] != 1 and len(picks) < 400:  # until a burst of K = 1 begins ...
        picks.append(unmeasured.choose(8))
    assert picks[-1] == 1, picks
    assert [unmeasured.choose(8, prefill=True) for _ in range(5)] == [0] * 5  # ... pauses
    assert [unmeasured.choose(8) for _ in range(3)] == [1, 1, 1]  # ... and goes on


def test_an_unmeasured_neighbour_is_explored_first(monkeypatch):
    """Best K = 1 at batch 1, K = 2 measured there and K = 0 not: until K = 0 is measured
    (4 steps), every exploration starts a burst of K = 0, never a close call of K = 2."""
    controller = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([0.9, 1.0, 0.95]))
    controller.measured[(1, 2)] = 100
    warm_up(controller)
    picks = []
    while controller.measured[(1, 0)] < 4 and len(picks) < 400:
        picks.append(controller.choose(1))
        controller.observe_step(0.03, 1 + picks[-1], picks[-1], 1, [(0, 0)])
    assert controller.measured[(1, 0)] == 4 and 2 not in picks, picks


def test_close_calls_are_tried_about_one_step_in_sixteen(monkeypatch):
    """K = 1 predicted at 95% of K = 0, already measured, batch 8: K = 0 is chosen, and
    K = 1 tried as a close call on about one step in 16 (explore)."""
    config = GoodputConfig(max_k=2, warmup_steps=1, seed=3, min_measured=0)
    controller = GoodputController(config)
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.95, 0.2]))
    picks = []
    for _ in range(1001):
        k = controller.choose(8)
        controller.observe_step(0.05 + 0.02 * k, 8 * (1 + k), k, 8, [(0, 0)] * 8)
        picks.append(k)
    assert 40 <= picks[1:].count(1) <= 90, picks.count(1)
    assert picks[0] == 1 and picks.count(2) == 0  # at batch 8 the warm-up tries K = 1 only


def test_a_close_call_of_k_zero_holds_for_two_steps(monkeypatch):
    """Best K = 1 at batch 8, K = 0 at 95% of it, K = 2 far behind, all measured: K = 0 is
    tried as a close call, always on two steps in a row, since the first verifies K = 1's
    drafts and only the second prices a step that rests; a step of another bucket between
    them ends the hold."""
    config = GoodputConfig(max_k=2, warmup_steps=1, seed=3, min_measured=0)
    controller = GoodputController(config)
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([0.95, 1.0, 0.5]))
    warm_up(controller)
    picks = "".join(str(controller.choose(8)) for _ in range(2000))
    runs = [len(run) for run in picks.split("1") if run]
    assert 20 <= len(runs) <= 60 and set(runs) <= {2, 4}, runs  # (4: two calls in a row)
    assert "2" not in picks
    controller._rest_again = None
    while controller.choose(8) != 0:
        pass
    assert controller.choose(16) == 1 and controller.choose(8) == 1


def test_a_k_priced_only_by_the_warm_up_is_measured_before_it_is_ruled_out(monkeypatch):
    """K = 1 predicted at 50% of K = 0 at batch 16 is still explored until 4 decode steps of
    batch 16 have run it (its price may come from prefill steps alone), in one burst of 4
    consecutive steps, then never; a prefill step at K = 1 does not count as a measurement."""
    controller = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.5, 0.2]))
    warm_up(controller)
    controller.observe_step(0.3, 500, 1, 16, [])  # K = 1 on a prefill step
    picks = []
    for _ in range(1000):
        k = controller.choose(16)
        controller.observe_step(0.05 + 0.02 * k, 16 * (1 + k), k, 16, [(0, 0)] * 16)
        picks.append(k)
    assert picks.count(1) == 4 and picks.count(2) == 0
    first = picks.index(1)
    assert first < 100 and picks[first : first + 4] == [1] * 4  # one burst, then none
    assert controller.measured[(16, 1)] == 4


def test_batch_sizes_of_one_bucket_share_their_trials(monkeypatch):
    """Under load the batch size wanders (64, 63, ..., 57): K = 1 predicted at 50% of K = 0
    is tried 4 times for the whole bucket 33-64, not 4 times per batch size (32 trials), and
    on 4 consecutive steps whatever the size within the bucket; batch 16 is a bucket of its
    own."""
    controller = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.5, 0.2]))
    warm_up(controller)
    picks = []
    for step in range(2000):
        batch = 64 - step % 8
        k = controller.choose(batch)
        controller.observe_step(0.05 + 0.02 * k, batch * (1 + k), k, batch, [(0, 0)] * batch)
        picks.append(k)
    assert picks.count(1) == 4 and picks.count(2) == 0
    assert picks[picks.index(1) :][:4] == [1] * 4
    assert controller.measured[(batch_bucket(57), 1)] == 4
    assert controller.measured[(batch_bucket(16), 1)] == 0
    assert [batch_bucket(b) for b in (1, 3, 4, 5, 16, 17, 64)] == [1, 4, 4, 8, 16, 32, 64]


def test_a_burst_ends_with_its_bucket_and_after_twice_its_length(monkeypatch):
    """A burst on K = 1 at batch 64 stops at the first step of batch 16 (another bucket: its
    own trials are counted there), and a burst whose steps all carry prefill, which measure
    nothing, stops after 8 steps instead of running on."""
    controller = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.5, 0.2]))
    warm_up(controller)
    picks = [0]
    while picks[-1] == 0:  # steps of K = 0 until a burst starts
        picks.append(controller.choose(64))
        controller.observe_step(0.1, 64 * (1 + picks[-1]), picks[-1], 64, [(0, 0)] * 64)
    assert picks[-1] == 1 and controller.choose(64) == 1  # the burst goes on ...
    controller.config = GoodputConfig(max_k=2, explore=0.0)  # (no new trial at batch 16)
    assert controller.choose(16) == 0 and controller._trial is None  # ... until batch 16

    controller = GoodputController(GoodputConfig(max_k=2, warmup_steps=1, seed=3))
    monkeypatch.setattr(controller, "predicted_goodput", lambda b, *_: np.array([1.0, 0.5, 0.2]))
    warm_up(controller)
    picks = []
    for _ in range(400):
        picks.append(controller.choose(64))
        controller.observe_step(0.3, 600, picks[-1], 64, [])  # prefill in every step
    first = picks.index(1)
    assert picks[first : first + 8] == [1] * 8 and picks[first + 8] == 0


def zen4_like_step(tokens: float, k: int, batch: int) -> float:
    """The reference target on the 2-core Zen 4 machine, float32: 43 ms a step up to 8
    tokens; drafting 0.3 ms plus 0.7 ms per head step and request (the engine's trace)."""
    return 0.043 + 0.0025 * max(0.0, tokens - 8) + (0.0003 if k else 0.0) + k * 0.0007 * batch


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_unlucky_start_does_not_pin_k_to_zero(seed):
    """The first 24 steps at batch 1 accept nothing (a hard opening of the first answer),
    then the heads' usual 27% at the first position holds. Drafting costs a few percent of a
    step, so K >= 1 pays from about 3% acceptance on. The plain mean of the counters has
    fallen to that by then, so a controller deciding on it stays at K = 0 until the bad
    start is forgotten (about 200 steps: 93-106 of the next 300 for seeds 0 and 2); deciding
    on an upper confidence bound, it drafts again within a few steps."""
    controller = GoodputController(GoodputConfig(max_k=4, max_tokens=2048))
    simulate(controller, (0.0, 0.0, 0.0, 0.0), zen4_like_step, [1], steps=24)
    assert controller.acceptance.rates()[0][0] < 0.03  # the plain mean has given up
    simulate(controller, (0.27, 0.15, 0.05, 0.02), zen4_like_step, [1], steps=300, seed=seed)
    picked = controller.log.k_by_batch()[1]
    assert picked.get(0, 0) < 0.05 * sum(picked.values()), picked


def test_optimism_does_not_keep_retrying_drafts_that_never_pay():
    """Heads that are never accepted, batch 1, the same cheap drafting: after 200 steps of
    learning, the bound is below what K = 1 needs and stays there through K = 0 steps
    (forgetting counts steps that verify drafts), so the model's own choice is K = 0; only
    exploration, about one step in 16, still tries K = 1. With forgetting per step the bound
    kept widening again, and K > 0 was 16% of the model's own choices."""
    controller = GoodputController(GoodputConfig(max_k=4, max_tokens=2048))
    simulate(controller, (0.0, 0.0, 0.0, 0.0), zen4_like_step, [1], steps=200)
    learnt = Counter(controller.log.chosen)
    simulate(controller, (0.0, 0.0, 0.0, 0.0), zen4_like_step, [1], steps=800, seed=1)
    later = controller.log.chosen - learnt
    assert later[(1, 0)] > 0.95 * sum(later.values()), later
    assert sum(controller.log.explored.values()) < 0.1 * 1000


def test_a_position_that_few_requests_reached_does_not_keep_its_prior():
    """Heads that accept nothing: 35 requests offered one draft, 5 offered four. Read per
    request offered, the last position keeps most of its prior (0.0625 of 6 requests, more
    than the first position's 0.5 of 41) and K = 4 looks four times as good as K = 1; as a
    chain, no draft reached position 1, so each later rate is its predecessor's (the prior),
    in the plain and the optimistic rates alike: a_i = p_0^(i+1), p_0+ * p_0^i."""
    model = AcceptanceModel(GoodputConfig(max_k=4, acceptance_memory=1.0))
    model.observe([(1, 1, 0)] * 35 + [(4, 4, 0)] * 5)
    p0 = 0.5 / 41
    assert model.rates()[0] == pytest.approx(p0 ** np.arange(1, 5))
    upper = model.optimistic_rates(1.0)[0]
    assert upper[0] > 3 * p0 and upper[1:] == pytest.approx(upper[0] * p0 ** np.arange(1, 4))
    assert model.offered.tolist() == [41, 6, 6, 6] and model.reached.tolist() == [41, 0, 0, 0]


def test_without_data_each_position_halves_and_data_replace_the_prior():
    """No drafts yet: a = 0.5, 0.25, 0.125. Heads accepting 50 % at the first position and
    20 % of what reaches the second, 200 requests offered two drafts: a ~ (0.5, 0.1)."""
    model = AcceptanceModel(GoodputConfig(max_k=3, acceptance_memory=1.0))
    assert model.rates()[0] == pytest.approx([0.5, 0.25, 0.125])
    model.observe([(2, 2, 0)] * 100 + [(2, 2, 1)] * 80 + [(2, 2, 2)] * 20)
    a = model.rates()[0]
    assert a[:2] == pytest.approx([0.5, 0.1], abs=0.01)
