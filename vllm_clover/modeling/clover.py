"""The whole Clover network for training and offline use, and its checkpoint weight names.

``CloverModel`` composes LayerFusion, BlockAdapter, AugmentingBlock, HeadLoop and TargetTables,
each owning one thing; vLLM's draft model (``core/model.py``) uses the same HeadLoop and tables.
The file stores the parts' tensors under flat names (docs/checkpoint-format.md, "Weights").
How it works: docs/design/network.md, "How the parts fit: clover.py".
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.modeling.augmenting import AugmentingBlock
from vllm_clover.modeling.block_adapter import ADAPTER_NAMES, ADAPTER_PREFIXES, BlockAdapter
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.head_loop import HeadLoop
from vllm_clover.modeling.layer_fusion import FUSION_PREFIX, LayerFusion
from vllm_clover.modeling.tables import TargetTables

AUGMENTING_PREFIXES = ("layers.", "norm.")
TABLES_NAMES = ("draft_vocab_ids",)


class CheckpointParts(NamedTuple):
    """A checkpoint's tensors split by the part that owns them (names relative to it)."""

    augmenting: dict[str, torch.Tensor]
    heads: dict[str, torch.Tensor]
    tables: dict[str, torch.Tensor]
    adapter: dict[str, torch.Tensor]
    fusion: dict[str, torch.Tensor]


def split_checkpoint_state(state: dict[str, torch.Tensor]) -> CheckpointParts:
    """Flat checkpoint names -> the tensors of each part (docs/checkpoint-format.md)."""
    parts = CheckpointParts({}, {}, {}, {}, {})
    for name, tensor in state.items():
        if name.startswith(FUSION_PREFIX):
            parts.fusion[name.removeprefix(FUSION_PREFIX)] = tensor
        elif name.startswith(AUGMENTING_PREFIXES):
            parts.augmenting[name] = tensor
        elif name.startswith(ADAPTER_PREFIXES) or name in ADAPTER_NAMES:
            parts.adapter[name] = tensor
        elif name in TABLES_NAMES:
            parts.tables[name] = tensor
        else:
            parts.heads[name] = tensor
    return parts


class CloverModel(nn.Module):
    """Augmenting Block + head loop + target tables (the paper's network, any ablation).

    Attach the target's LM head with ``attach_target`` after any ``.to(dtype)``. Entry points:
    ``forward`` (teacher-forced logits, training) and ``propose`` (greedy drafting from h0)."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        self.fusion = LayerFusion(config) if config.target_layers else None
        self.adapter = BlockAdapter(config)
        self.augmenting = AugmentingBlock(config) if config.use_augmenting_block else None
        self.heads = HeadLoop(config)
        self.tables = TargetTables(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.heads.dtype

    def attach_target(self, lm_head_weight: torch.Tensor) -> None:
        """Share the target's LM head (V, D)."""
        self.tables.attach(lm_head_weight)

    def augment(
        self,
        hidden_states: torch.Tensor,
        next_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """h0 for every position: the Augmenting Block over H (B, T, D), or H when off.

        With ``target_layers``, hidden_states is the signal (B, T, (1 + A) * D) and
        ``LayerFusion``(signal) takes H's place. next_ids (B, T): x_{t+1} at each position,
        read only with ``fuse_next_token``."""
        x = self.fuse_layers(hidden_states)
        if self.augmenting is None:
            return x
        x = self.adapter.block_input(x, next_ids, self.tables)
        return self.adapter.block_output(x, self.augmenting(x, positions))

    def fuse_layers(self, signal: torch.Tensor) -> torch.Tensor:
        """x (..., D) in the heads' dtype: H, or H fused with the target layers in signal."""
        if self.fusion is None:
            return signal.to(self.dtype)
        return self.fusion(signal).to(self.dtype)

    def head_features(
        self,
        hidden_states: torch.Tensor,
        head_input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced z: H (B, T, D), ids (B, T, K') -> (B, T, K', D). Score with
        ``logits`` in chunks when (B, T, K, N) logits are too large."""
        h0 = self.augment(hidden_states, head_input_ids[..., 0], positions)
        return self.heads.teacher_forced(h0, head_input_ids, self.tables)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Head features z (..., D) -> logits (..., N) in the heads' dtype (training)."""
        w = self.tables.vocab_weight(self.dtype)  # (N, D)
        return F.linear(z.to(w.dtype), w)

    def forward(
        self,
        hidden_states: torch.Tensor,
        head_input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, K', N); logits[b, t, i] scores x_{t+2+i} (draft vocab)."""
        return self.logits(self.head_features(hidden_states, head_input_ids, positions))

    def propose(self, h0: torch.Tensor, t0: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Greedy drafts (M, num_steps) from h0 (M, D) and t0 (M,) (``HeadLoop.propose``)."""
        return self.heads.propose(h0, t0, num_steps, self.tables)

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint stores, under their flat names (never the target's)."""
        parts = [self.heads, self.tables, self.adapter]
        parts += [self.augmenting] if self.augmenting else []
        state = {name: t for part in parts for name, t in part.state_dict().items()}
        if self.fusion is not None:
            state |= self.fusion.checkpoint_state()
        return state

    def load_checkpoint_state(self, state: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Load flat checkpoint tensors into the parts (strict: no missing, no extra name)."""
        parts = split_checkpoint_state(state)
        if self.augmenting is not None:
            self.augmenting.load_state_dict(parts.augmenting, strict=True, assign=assign)
        elif parts.augmenting:
            raise ValueError(f"unexpected Augmenting Block weights {sorted(parts.augmenting)}")
        self.heads.load_state_dict(parts.heads, strict=True, assign=assign)
        self.tables.load_state_dict(parts.tables, strict=True, assign=assign)
        self.adapter.load_state_dict(parts.adapter, strict=True, assign=assign)
        load_fusion(self.fusion, parts.fusion, assign)


def load_fusion(
    fusion: LayerFusion | None, state: dict[str, torch.Tensor], assign: bool = False
) -> None:
    """Load ``layer_fusion.*`` tensors (prefix removed); ValueError for fusion weights in a
    checkpoint whose config has no ``target_layers``."""
    if fusion is not None:
        fusion.load_state_dict(state, strict=True, assign=assign)
    elif state:
        raise ValueError(f"unexpected layer_fusion weights {sorted(state)} (no target_layers)")
