"""The EAGLE-3 drafter's shape, read from its target, and the speculators-format config.json
that vLLM 0.32 loads as ``{"method": "eagle3", "model": DIR}``.

The drafter is one Llama decoder layer of the target's width (arXiv 2503.01840): its input is
``fc([L_a | L_b | L_c])``, the inputs of three target decoder layers fused to one vector, next
to the embedding of the token after it; vLLM's ``llama_eagle3.py`` runs it, reading the fields
written here (``transformers_utils/configs/speculators/algos.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_clover.training.config import TrainingError
from vllm_clover.training.flags import opt

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose format this follows


@dataclass(frozen=True)
class Eagle3Config:
    """Everything the drafter's weights and vLLM's loader depend on."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # rows of the drafter's LM head (``d2t`` maps them to target ids)
    aux_layers: tuple[int, ...]  # target decoder layers whose input fc fuses (vLLM's aux ids)
    ttt_steps: int = 3  # training-time test: draft positions trained, the K it is made for

    @classmethod
    def from_target(
        cls,
        hf_config: Any,
        draft_vocab_size: int,
        aux_layers: tuple[int, ...] | None = None,
        ttt_steps: int = 3,
    ) -> Eagle3Config:
        """The drafter for a Llama-like target: its width, heads and RoPE; aux layers default
        to vLLM's (2, N // 2, N - 3). Example: SmolLM2-135M (30 layers) -> (2, 15, 27)."""
        n = hf_config.num_hidden_layers
        heads = hf_config.num_attention_heads
        rope = getattr(hf_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        return cls(
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", heads),
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope_theta=float(theta),
            max_position_embeddings=hf_config.max_position_embeddings,
            vocab_size=hf_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            aux_layers=tuple(aux_layers or (2, n // 2, n - 3)),
            ttt_steps=ttt_steps,
        )

    def speculators_json(self, verifier: str) -> dict[str, Any]:
        """config.json in the speculators format (``verifier``: the target's folder or id).
        The norm switches are written out: vLLM's defaults for them differ by loading path."""
        layer = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": False,
            "mlp_bias": False,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": False,
        }
        proposal = {
            "proposal_type": "greedy",
            "speculative_tokens": self.ttt_steps,
            "verifier_accept_k": 1,
            "accept_tolerance": 0.0,
        }
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "norm_before_residual": False,
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "tie_word_embeddings": False,
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [proposal],
                "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier},
            },
            "vllm_clover": asdict(self),  # this config, to read the checkpoint back
        }

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> Eagle3Config:
        """The config a checkpoint of ours was saved with (``speculators_json``)."""
        fields = dict(config["vllm_clover"])
        fields["aux_layers"] = tuple(fields["aux_layers"])
        return cls(**fields)


@dataclass
class Eagle3TrainConfig:
    """Every flag of `vllm-clover train-eagle3` (the shared ones mean what they do in `train`)."""

    target: str = opt(
        "", "target model: a folder, a cached HF id or 'smollm2-135m-instruct'", required=True
    )
    out: str = opt("", "output folder of the drafter (speculators format)", required=True)
    data: str | None = opt(None, "conversations, as `train --data` reads them")
    max_samples: int | None = opt(None, "use only the first N conversations of the data")
    max_seq_len: int = opt(1024, "truncate every tokenised conversation to this many tokens")
    eval_fraction: float = opt(0.02, "held-out fraction of the sequences for evaluation")
    draft_vocab_size: int = opt(8192, "rows of the drafter's LM head: the most frequent tokens")
    aux_layers: list[int] | None = opt(
        None, "target layers fused (default vLLM's 2, N/2, N-3)", nargs="+"
    )
    ttt_steps: int = opt(3, "training-time test steps: the drafts per step it is made for")
    step_decay: float = opt(0.8, "loss weight of TTT step k is this**k")
    epochs: int = opt(1, "passes over the training sequences")
    max_tokens: int | None = opt(None, "stop after this many training tokens")
    batch_size: int = opt(8, "sequences per optimizer step")
    lr: float = opt(1e-3, "peak learning rate (AdamW)")
    warmup_fraction: float = opt(0.03, "linear warmup share of the steps, then cosine to 0")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0 = off)")
    seed: int = opt(0, "seed of the initialisation, data order and split")
    dtype: str = opt(
        "float32", "compute dtype (bfloat16: autocast)", choices=("float32", "bfloat16")
    )
    device: str = opt("auto", "cpu, cuda, cuda:N or auto")
    cache_dir: str | None = opt(None, "hidden-state cache root (shared with `train`)")
    teacher_batch_tokens: int = opt(8192, "padded tokens per target forward when caching")
    overwrite: bool = opt(False, "replace an existing --out folder")
    progress: bool = opt(True, "the progress bar while caching")

    def __post_init__(self) -> None:
        if self.ttt_steps < 1 or self.draft_vocab_size < 1 or self.batch_size < 1:
            raise TrainingError("--ttt-steps, --draft-vocab-size and --batch-size must be >= 1")
        if Path(self.out).exists() and not self.overwrite:
            raise TrainingError(f"output folder {self.out} already exists (pass --overwrite)")
