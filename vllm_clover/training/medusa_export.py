"""Medusa export: Medusa-configured heads as a vLLM-native ``MedusaModel`` folder, and back.

``export-medusa`` lets the Medusa baseline run on vLLM 0.32's own Medusa proposer, without any
plugin code; ``read_medusa`` reads such a folder back as Clover heads (``train --init-from``).
Weight layout: docs/checkpoint-format.md, "Medusa export".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vllm_clover.fsutil import atomic_directory
from vllm_clover.modeling import CloverConfig, CloverModel, load_clover
from vllm_clover.modeling.checkpoint import (
    CONFIG_NAME,
    MODEL_CARD_NAME,
    WEIGHTS_NAME,
    CloverCheckpointError,
    check_same_architecture,
    read_config_json,
    stored_tensor,
)
from vllm_clover.training.card import vllm_usage
from vllm_clover.training.config import ExportMedusaConfig, TrainingError
from vllm_clover.training.flags import to_command_line


def export_medusa(
    model: CloverModel,
    out_dir: str | os.PathLike,
    lm_head_weight: torch.Tensor,
    *,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the vLLM Medusa folder (config.json + model.safetensors) of Medusa heads; a
    ValueError unless all Clover components are off (``model.config.is_medusa``)."""
    config = model.config
    if not config.is_medusa:
        raise ValueError(
            "export_medusa needs a Medusa-configured model (use_augmenting_block, "
            "use_attention_decoder and use_regressive_connection all off); this config has a "
            "Clover component on"
        )
    check_same_architecture(model, config)
    expected = (config.vocab_size, config.hidden_size)
    if tuple(lm_head_weight.shape) != expected:
        raise CloverCheckpointError(
            f"lm_head_weight shape {tuple(lm_head_weight.shape)} != {expected}"
        )
    lm_head = stored_tensor(lm_head_weight, dtype)
    medusa_config, state = medusa_state(model, lm_head)
    state = {name: stored_tensor(t, dtype) for name, t in state.items()}
    with atomic_directory(Path(out_dir), overwrite=overwrite) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(medusa_config, indent=2) + "\n", encoding="utf-8")
        save_file(state, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
    return Path(out_dir)


def medusa_state(
    model: CloverModel, lm_head: torch.Tensor
) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """config.json dict and tensors of a vLLM Medusa checkpoint (lm_head: (V, D) on CPU)."""
    config = model.config
    medusa_config: dict[str, object] = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": 1,
        "medusa_fc_bias": True,
        "torch_dtype": str(lm_head.dtype).removeprefix("torch."),
    }
    state: dict[str, torch.Tensor] = {}
    for i, block in enumerate(model.heads.blocks):
        state[f"blocks.{i}.layers.0.weight"] = block.layers[0].weight.detach().cpu().contiguous()
        state[f"blocks.{i}.layers.0.bias"] = block.layers[0].bias.detach().cpu().contiguous()
    ids = model.tables.draft_vocab_ids
    if ids is None:
        for i in range(config.num_heads):
            state[f"lm_heads.{i}.weight"] = lm_head.clone()  # safetensors refuses shared storage
    else:
        token_map = ids.detach().cpu().long().contiguous()
        state["lm_heads.0.weight"] = lm_head.index_select(0, token_map).contiguous()
        state["token_map"] = token_map
        medusa_config.update(truncated_vocab_size=int(token_map.numel()), original_lm_head=True)
    return medusa_config, state


def read_medusa(
    path: str | os.PathLike,
) -> tuple[CloverConfig, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A vLLM-native Medusa folder (what ``export_medusa`` writes) as Clover Medusa heads:
    (config, Clover tensors ``blocks.{i}.layers.0.*`` and ``draft_vocab_ids`` = ``token_map``,
    the stored ``lm_heads.*`` rows for the caller to check against the target's LM head).
    CloverCheckpointError names what is not an exported single-layer Medusa folder."""
    raw = read_config_json(path, "medusa")
    if raw.get("num_hidden_layers", 1) != 1 or not raw.get("medusa_fc_bias", False):
        raise CloverCheckpointError(
            f"{path}: only Medusa heads of one biased ResBlock layer (what export-medusa "
            "writes) can be read as Clover heads"
        )
    try:
        state = load_file(str(Path(path) / WEIGHTS_NAME))
    except (SafetensorError, OSError) as err:
        raise CloverCheckpointError(f"{path}: unreadable {WEIGHTS_NAME}: {err}") from err
    draft = raw.get("truncated_vocab_size")
    config = CloverConfig(
        hidden_size=raw["hidden_size"],
        vocab_size=raw["vocab_size"],
        num_heads=raw["num_heads"],
        use_augmenting_block=False,
        use_attention_decoder=False,
        use_regressive_connection=False,
        draft_vocab_size=draft,
    )
    heads = {k: v for k, v in state.items() if k.startswith("blocks.")}
    if draft:
        heads["draft_vocab_ids"] = state["token_map"]
    return config, heads, {k: v for k, v in state.items() if k.startswith("lm_heads.")}


def medusa_model_card(source_card: str | None, command: str, target: str, num_heads: int) -> str:
    """README.md of an exported folder: how to serve it, then the card of the heads it was
    exported from (their training and held-out accuracy)."""
    source = (
        "(the source heads had no model card)"
        if source_card is None
        else ("\n" + source_card).replace("\n#", "\n##").lstrip("\n")
    )
    return f"""# vLLM-native Medusa heads for `{target}`

Exported with `{command}` from Medusa-configured heads trained by `vllm-clover train
--medusa`; loads with vLLM's own Medusa proposer (no plugin code runs for it).

{vllm_usage(target, "medusa", num_heads)}

## Source heads

{source}"""


def export_medusa_command(cfg: ExportMedusaConfig) -> Path:
    """`vllm-clover export-medusa`: load the heads for the target, write the folder + card."""
    from vllm_clover.training.teacher import load_teacher

    teacher = load_teacher(cfg.target, torch.device("cpu"), torch.float32)
    try:  # CloverCheckpointError is a ValueError, as is "not a Medusa configuration"
        model = load_clover(cfg.heads, teacher.lm_head)
        dtype = getattr(torch, cfg.dtype)
        export_medusa(model, cfg.out, teacher.lm_head, overwrite=cfg.overwrite, dtype=dtype)
    except (ValueError, FileExistsError) as err:
        raise TrainingError(str(err)) from err
    source_card = Path(cfg.heads, MODEL_CARD_NAME)
    Path(cfg.out, MODEL_CARD_NAME).write_text(
        medusa_model_card(
            source_card.read_text() if source_card.is_file() else None,
            to_command_line(cfg, "vllm-clover export-medusa"),
            cfg.target,
            model.config.num_heads,
        ),
        encoding="utf-8",
    )
    print(f"wrote vLLM Medusa heads to {cfg.out}")
    return Path(cfg.out)
