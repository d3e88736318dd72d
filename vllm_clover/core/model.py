"""`CloverDraftModel`: the Clover network inside vLLM (vLLM layers + the shared head loop).

The Augmenting Block is re-expressed with vLLM's own `LlamaDecoderLayer` (paged attention,
parallel linear layers); the head loop is the very `HeadLoop` the trainer trains, reading the
target through a `TargetTables` (one rank's shard of it under tensor parallelism).
How it works: docs/design/drafting.md, "The draft model" (checkpoint names -> modules).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import LlamaConfig
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.utils import maybe_prefix

from vllm_clover.cpu.gemm import pack_linears
from vllm_clover.modeling.block_adapter import BlockAdapter
from vllm_clover.modeling.clover import load_fusion, split_checkpoint_state
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.head_loop import HeadLoop
from vllm_clover.modeling.layer_fusion import LayerFusion
from vllm_clover.modeling.tables import TargetTables
from vllm_clover.modeling.vocab_parallel import VocabParallelTables

# Checkpoint projections that vLLM's Llama layer fuses: (fused param, checkpoint name, shard).
STACKED_PARAMS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


def augmenting_layer_config(config: CloverConfig) -> LlamaConfig:
    """The Llama layer shape vLLM's LlamaDecoderLayer reads, from a CloverConfig (whose
    `attention_bias` and `qkv_bias` mean what vLLM's layer makes of them: q/k/v/o biases,
    and q/k/v only, as in Qwen2)."""
    return LlamaConfig(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_bias=config.attention_bias,
        qkv_bias=config.qkv_bias,
        vocab_size=config.vocab_size,
    )


def build_tables(config: CloverConfig, tensor_parallel_size: int) -> TargetTables:
    """The head loop's view of the target: whole, or under TP this rank's row shard, whose
    vocabulary operations talk over the TP group (modeling/vocab_parallel.py)."""
    if tensor_parallel_size == 1:
        return TargetTables(config)
    from vllm.distributed import get_tp_group

    return VocabParallelTables(config, group=get_tp_group().device_group)


class CloverDraftModel(nn.Module):
    """Augmenting Block (vLLM layers, own KV cache) and its adapter + head loop + tables."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config: CloverConfig = vllm_config.speculative_config.draft_model_config.hf_config
        self.config = config
        # Attention layers are registered by name; continue the target's layer numbering
        # (as vLLM's EAGLE heads do) so names are unique and carry a layer index.
        first = vllm_config.model_config.hf_config.num_hidden_layers
        depth = config.num_augmenting_layers if config.use_augmenting_block else 0
        layer_config = augmenting_layer_config(config)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                vllm_config,
                prefix=maybe_prefix(prefix, f"model.layers.{first + j}"),
                config=layer_config,
            )
            for j in range(depth)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps) if depth else None
        self.fusion = LayerFusion(config) if config.target_layers else None
        self.adapter = BlockAdapter(config)
        self.heads = HeadLoop(config)
        self.tables = build_tables(config, vllm_config.parallel_config.tensor_parallel_size)

    def fuse(self, signal: torch.Tensor) -> torch.Tensor:
        """[num_tokens, (1 + A) * D] target signal -> [num_tokens, D]: H with the target
        layers fused in (``LayerFusion``), or H itself for heads that read H alone."""
        return signal if self.fusion is None else self.fusion(signal)

    def forward(
        self,
        input_ids: torch.Tensor,
        # [num_tokens]
        positions: torch.Tensor,
        # [num_tokens, hidden_size]: the target's post-norm last hidden states
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        # [num_rows] token indices whose h0 is read; None: every token
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h0 at `rows` (every token when None): the Augmenting Block over H, or H itself
        when it is off; the block runs over every token, whose K and V enter its cache.
        Returns (h0, h0), both [num_rows, hidden_size] (EAGLE-style proposers expect a
        pair). `input_ids` are EAGLE's shifted ids (t0 after a request's last position);
        only a next-token fusion reads them."""
        h0 = hidden_states
        if self.layers:
            h0 = self.block(
                self.adapter.block_input(hidden_states, input_ids, self.tables), positions
            )
        h0 = h0 if rows is None else h0[rows]
        return h0, h0

    def block(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """h0 [num_tokens, D] from x [num_tokens, D]: the block's layers, reading and writing
        its paged KV cache (the forward context's attention metadata), then the gate."""
        hidden_states, residual = x, None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return self.adapter.block_output(x, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Route checkpoint tensors to the vLLM layers, the head loop and the tables; strict."""
        parts = split_checkpoint_state(dict(weights))
        self.heads.load_state_dict(parts.heads, strict=True)
        self.tables.load_state_dict(parts.tables, strict=True)
        self.adapter.load_state_dict(parts.adapter, strict=True)
        load_fusion(self.fusion, parts.fusion)
        loaded = {f"heads.{name}" for name, _ in self.heads.named_parameters()}
        loaded |= {f"adapter.{name}" for name, _ in self.adapter.named_parameters()}
        if self.fusion is not None:
            loaded |= {f"fusion.{name}" for name, _ in self.fusion.named_parameters()}
        loaded |= self._load_augmenting(list(parts.augmenting.items()))
        # On CPU the head network's few-row products run on vLLM's packed GEMM, as vLLM's
        # own layers do (the block's layers above already are vLLM's)
        pack_linears(self.heads, self.adapter, self.fusion)
        return loaded

    def _load_augmenting(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        """Load `layers.{j}.*` / `norm.weight`, fusing q/k/v and gate/up as vLLM stores them."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            shard = None
            for fused, part, shard_id in STACKED_PARAMS:
                if f".{part}." in name:
                    name, shard = name.replace(f".{part}.", f".{fused}."), shard_id
                    break
            if name not in params:
                raise ValueError(
                    f"Clover checkpoint weight {name!r} has no place in "
                    f"{type(self).__name__} (num_augmenting_layers mismatch?)"
                )
            param = params[name]
            if shard is None:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
            loaded.add(name)
        return loaded
