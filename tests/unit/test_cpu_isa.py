"""What this CPU multiplies in hardware (cpu/isa.py), and the choices made from it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_clover.cpu import isa

pytestmark = pytest.mark.unit

ZEN3 = frozenset({"avx2", "fma", "f16c"})
ICE_LAKE = ZEN3 | {"avx512f", "avx512_vnni"}
ZEN4 = ICE_LAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_int8", "amx_tile"}


def test_families_by_their_flags():
    assert isa.isa_family(ZEN3) == "AVX2"
    assert isa.isa_family(ICE_LAKE) == "AVX-512"
    assert isa.isa_family(ZEN4) == "AVX512-BF16"
    assert isa.isa_family(SAPPHIRE_RAPIDS) == "AMX"
    assert isa.isa_family(frozenset({"sse4_2"})) == "pre-AVX2"


def test_forced_flags_stand_for_the_cpus(monkeypatch):
    monkeypatch.setenv(isa.FLAGS_ENV, " ".join(sorted(ZEN4)))
    isa.cpu_flags.cache_clear()
    try:
        assert isa.cpu_flags() == ZEN4
    finally:
        isa.cpu_flags.cache_clear()


def _choice_under(env: dict[str, str]) -> list[str]:
    """What a fresh process, with `env` set before oneDNN starts, says it multiplies with."""
    code = (
        "from vllm_clover.cpu.gemm import bf16_products, onednn_takes_bf16\n"
        "print(onednn_takes_bf16()); print(bf16_products())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-2:]


def test_an_emulated_avx2_cpu_multiplies_bf16_on_the_plugins_gemm():
    """ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN refuse bf16 as it does on an AVX2-only EPYC."""
    assert _choice_under({"ONEDNN_MAX_CPU_ISA": "AVX2"}) == ["False", "the plugin's AVX2 GEMM"]


@pytest.mark.skipif("avx512_bf16" not in isa.cpu_flags(), reason="needs a CPU with bf16 units")
def test_a_cpu_with_bf16_units_keeps_onednn():
    assert _choice_under({}) == ["True", "oneDNN"]
