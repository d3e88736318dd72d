"""The Clover network and its checkpoint format, in pure PyTorch (never imports vLLM).

Shared by the trainer and the vLLM layer; see docs/design.md and docs/checkpoint-format.md.
"""

from vllm_clover.modeling.augmenting import AugmentingBlock
from vllm_clover.modeling.checkpoint import (
    CloverCheckpointError,
    lm_head_fingerprint,
    load_clover,
    load_clover_config,
    read_clover,
    save_clover,
)
from vllm_clover.modeling.clover import CloverModel
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.head_loop import HeadLoop
from vllm_clover.modeling.tables import TargetTables, draft_vocab_from_counts
from vllm_clover.modeling.target_layers import select_last_layers
from vllm_clover.modeling.teacher_forcing import HeadTokens, shift_tokens_for_heads

__all__ = [
    "AugmentingBlock",
    "CloverCheckpointError",
    "CloverConfig",
    "CloverModel",
    "HeadLoop",
    "HeadTokens",
    "TargetTables",
    "draft_vocab_from_counts",
    "lm_head_fingerprint",
    "load_clover",
    "load_clover_config",
    "read_clover",
    "save_clover",
    "select_last_layers",
    "shift_tokens_for_heads",
]
