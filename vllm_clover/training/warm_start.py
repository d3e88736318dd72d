"""`train --init-from DIR`: continue a Clover checkpoint (or an ``export-medusa`` folder) on
new data, from DIR's weights and draft vocabulary, with a new optimizer and lr schedule. The
run's network flags must describe DIR's network (the weights load strictly); each difference
is named before any teacher work. How it works: docs/training.md, "Continued training".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_clover.modeling import CloverCheckpointError, CloverConfig, CloverModel, read_clover
from vllm_clover.modeling.checkpoint import (
    check_target_fits,
    check_target_shape,
    read_config_json,
)
from vllm_clover.training.config import TrainConfig, TrainingError
from vllm_clover.training.medusa_export import read_medusa

# The CloverConfig fields that decide the network's wiring, and the train flag of each.
NETWORK_FLAGS = {
    "num_heads": "num_heads",
    "use_augmenting_block": "augmenting_block",
    "num_augmenting_layers": "num_augmenting_layers",
    "augmenting_gate": "augmenting_gate",
    "use_attention_decoder": "attention_decoder",
    "use_regressive_connection": "regressive_connection",
    "fuse_next_token": "fuse_next_token",
    "head_projection": "head_projection",
    "draft_vocab_size": "draft_vocab_size",
    "target_layers": "target_layers",
}


@dataclass(frozen=True)
class InitCheckpoint:
    """The checkpoint a run starts from: its config and flat tensors (CPU)."""

    path: str
    config: CloverConfig
    state: dict[str, torch.Tensor]
    lm_heads: dict[str, torch.Tensor]  # a native Medusa folder's LM-head rows (else empty)

    @classmethod
    def read(cls, cfg: TrainConfig) -> InitCheckpoint:
        """Read and validate ``cfg.init_from`` against the run's network flags, before any
        data is prepared, so that a wrong checkpoint fails fast. Example of the error:
        ``num_heads: checkpoint 4, this run 3``."""
        path = str(cfg.init_from)
        if not Path(path).is_dir():
            raise TrainingError(f"--init-from {path}: no such checkpoint folder")
        lm_heads: dict[str, torch.Tensor] = {}
        try:
            if read_config_json(path, model_type=None).get("model_type") == "medusa":
                config, state, lm_heads = read_medusa(path)
            else:
                config, state = read_clover(path)
        except CloverCheckpointError as err:
            raise TrainingError(f"--init-from {path}: {err}") from err
        differ = [
            f"{name}: checkpoint {getattr(config, name)!r}, this run {getattr(cfg, flag)!r}"
            for name, flag in NETWORK_FLAGS.items()
            if getattr(config, name) != getattr(cfg, flag)
            and not (name == "target_layers" and config.target_layers is None)
        ]
        if differ:
            raise TrainingError(
                f"--init-from {path} has another network than this run's flags ask for ("
                + "; ".join(differ)
                + "): pass the flags it was trained with (its README.md lists them)"
            )
        return cls(path, config, state, lm_heads)

    @property
    def draft_vocab_ids(self) -> torch.Tensor | None:
        """(N,) the checkpoint's draft vocabulary (None: it drafts over the full vocabulary)."""
        return self.state.get("draft_vocab_ids")

    def load_into(self, model: CloverModel, lm_head: torch.Tensor, target_name: str) -> None:
        """Copy the weights into ``model``, the network built from this run's flags; a
        TrainingError when the target is not the one the checkpoint was trained for."""
        try:
            if self.lm_heads:  # Medusa: its LM-head rows identify the target
                check_target_shape(self.config, self.path, lm_head.shape[1], lm_head.shape[0])
                self.check_lm_heads(lm_head)
            else:
                check_target_fits(self.config, self.path, lm_head, target_name=target_name)
            with torch.no_grad():
                model.load_checkpoint_state(self.state | self.added_fusion(model))
        except (CloverCheckpointError, ValueError, RuntimeError) as err:
            raise TrainingError(f"--init-from {self.path}: {err}") from err

    def added_fusion(self, model: CloverModel) -> dict[str, torch.Tensor]:
        """The run's fresh (zero) layer fusion when it adds ``--target-layers`` to heads that
        read H alone: x = H at the start, so the heads begin exactly where they stopped."""
        if model.fusion is None or self.config.target_layers is not None:
            return {}
        return model.fusion.checkpoint_state()

    def check_lm_heads(self, lm_head: torch.Tensor) -> None:
        """A native Medusa folder's LM-head rows are the target's (V, D) ``lm_head`` rows of
        the draft vocabulary, as export-medusa writes them; anything else would be dropped."""
        ids = self.draft_vocab_ids
        rows = lm_head if ids is None else lm_head.index_select(0, ids.long())
        for name, stored in self.lm_heads.items():
            if not torch.equal(stored, rows.to(stored.dtype)):
                raise CloverCheckpointError(
                    f"{name} is not the target's LM head: only Medusa heads that share it "
                    "(what export-medusa writes) can be continued"
                )
