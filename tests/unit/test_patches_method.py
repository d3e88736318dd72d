"""The patches that make "clover" a speculative method (patches/method.py)."""

from __future__ import annotations

from typing import get_args

import pytest

from vllm_clover import patches

pytestmark = pytest.mark.unit


def test_async_scheduling_admits_clover_like_eagle():
    """The config check that decides async scheduling sees Clover as an EAGLE-style method."""
    from vllm.config import vllm as config_module

    patches.apply_patches()
    patches.apply_patches()
    methods = get_args(config_module.EagleModelTypes)
    assert "clover" in methods and "eagle" in methods
    assert methods.count("clover") == 1


def test_use_eagle_is_on_for_clover_only():
    from types import SimpleNamespace

    from vllm.config.speculative import SpeculativeConfig

    patches.apply_patches()
    assert SpeculativeConfig.use_eagle(SimpleNamespace(method="clover"))
    assert not SpeculativeConfig.use_eagle(SimpleNamespace(method="ngram"))


def test_draft_lengths_cut_each_clover_row_at_its_first_minus_one():
    """[12, 7, -1] reaches the scheduler as [12, 7]: that request verifies two drafts."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patches.apply_patches()

    def runner(stops_early: bool) -> SimpleNamespace:
        rows = [[12, 7, -1], [3, 4, 5], [-1, -1, -1]]
        return SimpleNamespace(
            num_spec_tokens=3,
            _draft_token_req_ids=["a", "b", "c"],
            _get_draft_token_ids_cpu=lambda: (rows, ["a", "b", "c"]),
            drafter=SimpleNamespace(stops_early=stops_early),
        )

    drafts = GPUModelRunner.take_draft_token_ids(runner(stops_early=True))
    assert drafts.req_ids == ["a", "b", "c"]
    assert drafts.draft_token_ids == [[12, 7], [3, 4, 5], []]
    untouched = GPUModelRunner.take_draft_token_ids(runner(stops_early=False))
    assert untouched.draft_token_ids[0] == [12, 7, -1]  # other drafters: as vLLM hands them


def test_clover_keys_of_speculative_config_are_clover_only():
    from vllm.config.speculative import SpeculativeConfig

    from vllm_clover.core.checks import CloverStartupError

    patches.apply_patches()
    assert SpeculativeConfig(method="ngram", num_speculative_tokens=2).draft_confidence is None
    with pytest.raises(
        CloverStartupError, match=r"\['draft_confidence'\] apply to method 'clover'"
    ):
        SpeculativeConfig(method="ngram", num_speculative_tokens=2, draft_confidence=0.3)
    with pytest.raises(CloverStartupError, match=r"\['draft_budget'\] apply to method 'clover'"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=2, draft_budget="fixed")


def test_draft_sample_method_tells_no_setting_from_greedy():
    """Not given, it is None until post_init resolves it: vLLM's "greedy" for other methods
    (Clover's chains: "probabilistic", see test_checks); given, it is kept."""
    from vllm.config.speculative import SpeculativeConfig

    from vllm_clover.patches.method import vllm_draft_sample_default

    patches.apply_patches()
    patches.apply_patches()
    assert SpeculativeConfig.__dataclass_fields__["draft_sample_method"].default is None
    assert vllm_draft_sample_default(SpeculativeConfig) == "greedy"
    ngram = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    assert ngram.draft_sample_method == "greedy"
    drawn = SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, draft_sample_method="probabilistic"
    )
    assert drawn.draft_sample_method == "probabilistic"
    with pytest.raises(ValueError, match="draft_sample_method"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=2, draft_sample_method="top")


def test_applying_the_patches_again_wraps_propose_once_per_patch():
    """Two patches wrap the runner's propose_draft_token_ids (target_signal, then block_rest
    around it); applying the ledger again, as vLLM's second plugin load does, must add
    neither (a second target_signal put H twice before the target's layers)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_clover.patches.marking import MARKER

    def marks() -> list[str]:
        names, function = [], GPUModelRunner.propose_draft_token_ids
        while function is not None:
            names.append(getattr(function, MARKER, None))
            function = getattr(function, "__wrapped__", None)
        return [name for name in names if name]

    patches.apply_patches()
    first = marks()
    patches.apply_patches()
    assert marks() == first and sorted(first) == ["block_rest", "target_signal"]
