"""Pure-PyTorch Clover draft network and checkpoint format (no vLLM imports).

Shared by the trainer and the vLLM wrapper; see docs/checkpoint-format.md.
"""

from vllm_clover.modeling.augmenting import init_augmenting_from_target, select_last_layers
from vllm_clover.modeling.checkpoint import (
    CloverCheckpointError,
    export_medusa,
    lm_head_fingerprint,
    load_clover,
    load_clover_config,
    save_clover,
)
from vllm_clover.modeling.clover import CloverHeads
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.scoring import draft_vocab_from_counts
from vllm_clover.modeling.teacher_forcing import HeadTokens, shift_tokens_for_heads

__all__ = [
    "CloverCheckpointError",
    "CloverConfig",
    "CloverHeads",
    "HeadTokens",
    "draft_vocab_from_counts",
    "export_medusa",
    "init_augmenting_from_target",
    "lm_head_fingerprint",
    "load_clover",
    "load_clover_config",
    "save_clover",
    "select_last_layers",
    "shift_tokens_for_heads",
]
