"""The patches that make "clover" a speculative method (integration/patches/method.py)."""

from __future__ import annotations

from typing import get_args

import pytest

from vllm_clover.integration import patches

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
