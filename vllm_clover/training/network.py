"""The network `train` starts from when it does not continue a checkpoint (`--init-from`,
vllm_clover/training/warm_start.py): a fresh CloverModel sized from the target, its Augmenting
Block copied from the target's last layer(s), its draft vocabulary from the training data."""

from __future__ import annotations

import torch

from vllm_clover.modeling import CloverConfig, CloverModel
from vllm_clover.modeling.target_layers import bias_fields, parameter_names
from vllm_clover.training.config import TrainConfig, TrainingError
from vllm_clover.training.pipeline import Prepared
from vllm_clover.training.teacher import Teacher, augmenting_init, check_block_mirrors


def preflight(cfg: TrainConfig, teacher: Teacher) -> None:
    """TrainingError, before any data is tokenised or cached, for what about the target
    refuses a run: the Augmenting Block's copy of its last layer(s) (naming
    --no-augmenting-block), the Clover configuration for it, the draft vocabulary's size."""
    vocab = int(teacher.lm_head.shape[0])
    if cfg.draft_vocab_size and cfg.draft_vocab_size > vocab:
        raise TrainingError(
            f"--draft-vocab-size {cfg.draft_vocab_size} is larger than the target's vocabulary "
            f"({vocab}): pass a smaller one, or 0 for the whole vocabulary"
        )
    block_init = (
        augmenting_init(teacher, cfg.num_augmenting_layers) if cfg.augmenting_block else None
    )
    clover_config(cfg, teacher, block_init)


def build_model(cfg: TrainConfig, prepared: Prepared, device: torch.device) -> CloverModel:
    """A fresh network for the target (seeded): Augmenting Block copied from its last
    layer(s) and checked to reproduce them, draft vocabulary from the training data."""
    teacher = prepared.teacher
    block_init = (
        augmenting_init(teacher, cfg.num_augmenting_layers) if cfg.augmenting_block else None
    )
    config = clover_config(cfg, teacher, block_init)
    torch.manual_seed(cfg.seed)
    model = CloverModel(config)
    if block_init is not None:
        model.augmenting.init_from_target(*block_init)
    if prepared.draft_vocab_ids is not None:
        model.tables.set_draft_vocab(prepared.draft_vocab_ids)
    model.to(device)
    if model.augmenting is not None:
        check_block_mirrors(teacher, model.augmenting)
    model.attach_target(teacher.lm_head.to(device))
    return model


def clover_config(cfg: TrainConfig, teacher: Teacher, block_init: tuple | None) -> CloverConfig:
    """The Clover configuration for this target and these flags (TrainingError if the
    target does not fit Clover, naming why)."""
    biases = bias_fields(parameter_names(block_init[0][-1])) if block_init else {}
    try:
        return CloverConfig.from_target_config(
            teacher.config,
            target_name=cfg.target,
            num_heads=cfg.num_heads,
            use_augmenting_block=cfg.augmenting_block,
            num_augmenting_layers=cfg.num_augmenting_layers,
            use_attention_decoder=cfg.attention_decoder,
            use_regressive_connection=cfg.regressive_connection,
            fuse_next_token=cfg.fuse_next_token,
            head_projection=cfg.head_projection,
            augmenting_gate=cfg.augmenting_gate,
            draft_vocab_size=cfg.draft_vocab_size,
            target_layers=cfg.target_layers,
            **biases,
        )
    except (ValueError, AttributeError) as err:
        raise TrainingError(f"target {cfg.target!r} does not fit Clover: {err}") from err
