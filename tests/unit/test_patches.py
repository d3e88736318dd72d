"""The patches ledger: its fingerprints match the installed vLLM, every entry was read from the
pinned vLLM, the proposer uses nothing of its vLLM base class that the ledger does not list,
and the patches apply once."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from vllm_clover import patches
from vllm_clover.compat import supported_vllm_version
from vllm_clover.core import proposer
from vllm_clover.patches import LEDGER, PATCHES, fingerprint
from vllm_clover.patches.entry import READ_FROM

pytestmark = pytest.mark.unit


def test_every_fingerprint_matches_the_installed_vllm():
    """Fails when vLLM changes any code we patch, override or rely on: re-read it, then update
    the entry (`python -m vllm_clover.patches.fingerprint` lists what changed)."""
    stale = fingerprint.stale_targets()
    assert stale == [], "\n".join(
        f"{name}: {target} recorded {old}, installed {new}" for name, target, old, new in stale
    )


def test_a_changed_vllm_function_is_detected(monkeypatch):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def _get_slot_mapping(self, num_tokens, slot_mapping=None):  # a vLLM upgrade, say
        return {}

    monkeypatch.setattr(SpecDecodeBaseProposer, "_get_slot_mapping", _get_slot_mapping)
    stale = fingerprint.stale_targets()
    assert [(name, target.rsplit(".", 1)[-1]) for name, target, *_ in stale] == [
        ("proposer_first_pass", "_get_slot_mapping")
    ]


def test_every_entry_was_read_from_the_pinned_vllm():
    assert READ_FROM == supported_vllm_version()
    assert len({entry.name for entry in LEDGER}) == len(LEDGER)
    assert {entry.kind for entry in LEDGER} <= {"patch", "override", "relies", "hook"}
    assert all(entry.apply is not None for entry in PATCHES)


def _base_members_the_proposer_uses() -> set[str]:
    """Names CloverProposer overrides, calls or reads that vLLM's proposer classes define."""
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    tree = ast.parse(Path(proposer.__file__).read_text())
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    used |= {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", "") == "super"
    }
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CloverProposer"]
    used |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    base_source = inspect.getsource(llm_base_proposer)
    return {
        name
        for name in used
        if hasattr(EagleProposer, name)
        or f"self.{name} =" in base_source
        or f"self.{name}:" in base_source
    }


def test_the_proposer_uses_only_what_the_ledger_lists():
    listed = {
        target.rsplit(".", 1)[-1]
        for entry in LEDGER
        if entry.used_by == "core/proposer.py"
        for target in entry.targets
    }
    listed |= {attribute for entry in LEDGER for attribute in entry.attributes}
    used = _base_members_the_proposer_uses()
    assert {"propose", "set_inputs_first_pass", "kv_cache_gid"} <= used  # the scan works
    assert used - listed == set(), "add these to the ledger (patches/reliances.py)"


def test_patches_apply_once_and_admit_clover():
    from vllm.config.speculative import SpeculativeConfig

    patches.apply_patches()
    post_init = SpeculativeConfig.__post_init__
    patches.apply_patches()  # vLLM may run the plugin twice in one process
    assert SpeculativeConfig.__post_init__ is post_init
    assert "clover" in str(SpeculativeConfig.__dataclass_fields__["method"].type)


def test_a_patch_is_seen_under_any_wrapper_put_around_it():
    """Another wrapper around a patched method (a second patch, a profiler's) must not make the
    patch look absent, or applying the ledger again would wrap the method twice."""
    import functools

    from vllm_clover.patches.marking import is_patched, mark

    def method() -> None: ...

    patched = mark(functools.wraps(method)(lambda: method()), "inner")
    outer = mark(functools.wraps(patched)(lambda: patched()), "outer")
    profiled = functools.wraps(outer)(lambda: outer())
    profiled.__dict__.pop("__vllm_clover_patch__")  # a wrapper that copies nothing of ours
    assert is_patched(profiled, "inner") and is_patched(profiled, "outer")
    assert not is_patched(method, "inner") and not is_patched(profiled, "other")


def test_a_patch_that_does_not_fit_names_itself(monkeypatch):
    broken = patches.Entry("broken", "patch", "a test", "tests", {}, apply=lambda: {}["gone"])
    monkeypatch.setattr(patches, "PATCHES", (broken,))
    with pytest.raises(RuntimeError, match="patch 'broken' .a test. does not fit"):
        patches.apply_patches()


def test_fixes_for_every_engine_can_be_skipped_by_name(monkeypatch):
    """$CLOVER_SKIP_FIXES leaves out the fixes that change vanilla engines too; a name that
    is not one of them is an error that lists them."""
    calls = []
    fix = patches.Entry("fix", "patch", "t", "tests", {}, apply=lambda: calls.append("fix"))
    fix = dataclasses.replace(fix, every_engine=True)
    own = patches.Entry("own", "patch", "t", "tests", {}, apply=lambda: calls.append("own"))
    monkeypatch.setattr(patches, "PATCHES", (fix, own))
    for value, applied in (("", ["fix", "own"]), ("fix", ["own"]), ("all", ["own"])):
        monkeypatch.setenv(patches.SKIP_FIXES_ENV, value)
        calls.clear()
        patches.apply_patches()
        assert calls == applied
    monkeypatch.setenv(patches.SKIP_FIXES_ENV, "own")
    with pytest.raises(ValueError, match="own is not one of the fixes that change every engine"):
        patches.apply_patches()


def test_nothing_of_the_plugins_is_hung_on_vllms_objects_but_the_channel():
    """The plugin's data travels between vLLM's scheduler, runner and attention metadata in
    the one typed channel (patches/channel.py, ledger entry clover_channel): no attribute
    named clover_* is set or read anywhere in the package."""
    import re

    import vllm_clover

    side_channel = re.compile(r"\.clover_\w+\s*=|(?:get|set|has)attr\([^)]*[\"']clover_")
    found = [
        f"{path.name}:{number}"
        for path in Path(vllm_clover.__file__).parent.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if side_channel.search(line)
    ]
    assert found == []
    channel = next(e for e in LEDGER if e.name == "clover_channel")
    from vllm_clover.patches.channel import CHANNEL

    assert channel.attributes == (CHANNEL,)


def test_every_fix_for_every_engine_names_the_vllm_bug_it_works_around():
    fixes = [e for e in PATCHES if e.every_engine]
    assert {e.name for e in fixes} >= {"cpu_float_expand", "cpu_malloc", "cpu_bf16_gemm"}
    # the reason names the vLLM code at fault, one of the entry's fingerprinted objects
    unnamed = [
        e.name
        for e in fixes
        if len(e.reason) < 40 or not any(t.split(":")[1] in e.reason for t in e.targets)
    ]
    assert unnamed == []
