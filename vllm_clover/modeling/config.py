"""The typed configuration of a Clover network (``model_type = "clover"``).

One ``CloverConfig`` describes everything needed to rebuild the draft network from its
checkpoint: which components are on, the Augmenting Block's shape (copied from the target's
decoder layers) and the target's identity. Fields: docs/checkpoint-format.md; an example:
docs/design/network.md, "The configuration: config.py".
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from vllm_clover.modeling.target_layers import hidden_activation, rope_parameters
from vllm_clover.tree.spec import TokenTree, TokenTreeError

HEAD_PROJECTIONS = ("residual", "linear")
# The architecture name of every Clover checkpoint: the draft model class vLLM builds from it.
CLOVER_ARCHITECTURE = "CloverModel"


class CloverConfig(PretrainedConfig):
    """Configuration of the Clover heads (Augmenting Block + Attention Decoder + heads).

    One keyword per config.json field (docs/checkpoint-format.md: type, default, meaning)."""

    model_type = "clover"

    def __init__(
        self,
        hidden_size: int = 4096,
        vocab_size: int = 32000,
        num_heads: int = 3,
        use_augmenting_block: bool = True,
        num_augmenting_layers: int = 1,
        use_attention_decoder: bool = True,
        decoder_num_heads: int | None = None,
        use_regressive_connection: bool = True,
        regressive_embedding: str = "lm_head",
        fuse_next_token: bool = False,
        head_projection: str = "residual",
        augmenting_gate: bool = False,
        draft_vocab_size: int | None = None,
        draft_confidence: list[float] | None = None,
        token_tree: str | None = None,
        target_layers: list[int] | None = None,
        target_num_hidden_layers: int = 0,
        intermediate_size: int = 11008,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 4096,
        hidden_act: str = "silu",
        attention_bias: bool = False,
        qkv_bias: bool | None = None,
        target_name: str = "",
        target_hidden_size: int | None = None,
        target_vocab_size: int | None = None,
        target_lm_head_fingerprint: str = "",
        **kwargs: Any,
    ) -> None:
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.num_heads = num_heads
        self.use_augmenting_block = use_augmenting_block
        self.num_augmenting_layers = num_augmenting_layers
        self.use_attention_decoder = use_attention_decoder
        self.decoder_num_heads = _default(decoder_num_heads, num_attention_heads)
        self.use_regressive_connection = use_regressive_connection
        self.regressive_embedding = regressive_embedding
        self.fuse_next_token = fuse_next_token
        self.head_projection = head_projection
        self.augmenting_gate = augmenting_gate
        self.draft_vocab_size = draft_vocab_size
        self.draft_confidence = None if draft_confidence is None else list(draft_confidence)
        self.token_tree = token_tree
        self.target_layers = None if target_layers is None else list(target_layers)
        self.target_num_hidden_layers = target_num_hidden_layers
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = _default(num_key_value_heads, num_attention_heads)
        self.head_dim = _default(head_dim, hidden_size // max(num_attention_heads, 1))
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.hidden_act = hidden_act
        self.attention_bias = attention_bias
        self.qkv_bias = attention_bias if qkv_bias is None else qkv_bias
        self.target_name = target_name
        self.target_hidden_size = _default(target_hidden_size, hidden_size)
        self.target_vocab_size = _default(target_vocab_size, vocab_size)
        self.target_lm_head_fingerprint = target_lm_head_fingerprint
        kwargs.setdefault("architectures", [CLOVER_ARCHITECTURE])
        super().__init__(**kwargs)
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        _require(self.hidden_size >= 1, f"hidden_size must be >= 1, got {self.hidden_size}")
        _require(self.vocab_size >= 1, f"vocab_size must be >= 1, got {self.vocab_size}")
        _require(self.num_heads >= 1, f"num_heads must be >= 1, got {self.num_heads}")
        _require(
            self.regressive_embedding == "lm_head",
            f'regressive_embedding must be "lm_head", got {self.regressive_embedding!r}',
        )
        _require(
            self.head_projection in HEAD_PROJECTIONS,
            f"head_projection must be one of {HEAD_PROJECTIONS}, got {self.head_projection!r}",
        )
        if self.fuse_next_token:
            _require(
                self.use_augmenting_block and self.use_regressive_connection,
                "fuse_next_token fuses the next token into the Augmenting Block's input: it "
                "needs use_augmenting_block and use_regressive_connection",
            )
        _require(
            not self.augmenting_gate or self.use_augmenting_block,
            "augmenting_gate gates the Augmenting Block: it needs use_augmenting_block",
        )
        if self.use_attention_decoder or self.fuse_next_token:
            _require(
                self.decoder_num_heads >= 1 and self.hidden_size % self.decoder_num_heads == 0,
                f"decoder_num_heads={self.decoder_num_heads} must be >= 1 and divide "
                f"hidden_size={self.hidden_size}",
            )
        if self.draft_vocab_size is not None:
            _require(
                1 <= self.draft_vocab_size <= self.vocab_size,
                f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}] or None, "
                f"got {self.draft_vocab_size}",
            )
        if self.draft_confidence is not None:
            problem = check_confidence(self.draft_confidence, self.num_heads)
            _require(not problem, f"draft_confidence: {problem}")
        self._validate_tree_and_layers()
        _require(
            self.target_hidden_size == self.hidden_size,
            f"target_hidden_size={self.target_hidden_size} != hidden_size={self.hidden_size}",
        )
        _require(
            self.target_vocab_size == self.vocab_size,
            f"target_vocab_size={self.target_vocab_size} != vocab_size={self.vocab_size}",
        )
        if self.use_augmenting_block:
            self._validate_augmenting()

    def _validate_tree_and_layers(self) -> None:
        if self.target_layers is not None:
            problem = check_target_layers(self.target_layers, self.target_num_hidden_layers)
            _require(not problem, f"target_layers: {problem}")
        if self.token_tree is None:
            return
        try:
            tree = TokenTree.parse(self.token_tree)
            tree.check_fits(self.num_heads, self.draft_vocab_size or self.vocab_size)
        except TokenTreeError as error:
            _require(False, f"token_tree: {error}")

    def _validate_augmenting(self) -> None:
        _require(
            self.num_augmenting_layers >= 1,
            f"num_augmenting_layers must be >= 1 when use_augmenting_block is on, "
            f"got {self.num_augmenting_layers}",
        )
        _require(
            self.num_attention_heads >= 1
            and self.num_key_value_heads >= 1
            and self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_key_value_heads={self.num_key_value_heads} must divide "
            f"num_attention_heads={self.num_attention_heads}",
        )
        _require(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        _require(self.intermediate_size >= 1, "intermediate_size must be >= 1")
        _require(
            self.hidden_act == "silu",
            f"only hidden_act='silu' (SwiGLU) is supported, got {self.hidden_act!r}",
        )

    # ------------------------------------------------------------------ views
    @property
    def is_medusa(self) -> bool:
        """True when all three Clover components are off (= Medusa-1 heads)."""
        return not (
            self.use_augmenting_block
            or self.use_attention_decoder
            or self.use_regressive_connection
        )

    @property
    def num_hidden_layers(self) -> int:
        """Decoder layers that need a KV cache (Augmenting Block), 0 when it is off: a derived
        view for code that sizes caches from it (vLLM's ModelConfig), never in config.json.
        Setting it to another value raises."""
        return self.num_augmenting_layers if self.use_augmenting_block else 0

    @num_hidden_layers.setter
    def num_hidden_layers(self, value: int) -> None:
        if value != self.num_hidden_layers:
            raise ValueError(
                f"CloverConfig: num_hidden_layers is derived (= {self.num_hidden_layers}); "
                "set use_augmenting_block / num_augmenting_layers instead"
            )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_target_config(
        cls, target: PretrainedConfig, *, target_name: str = "", **kwargs: Any
    ) -> CloverConfig:
        """Copy hidden/vocab size and decoder-layer shape from a target config (its text part).

        ``kwargs`` set the Clover fields (num_heads, use_* flags, ...) and may override any
        copied field. Whether the block can mirror the layer is a separate check
        (``target_layers.mirror_problems``)."""
        text = target.get_text_config() if hasattr(target, "get_text_config") else target
        copied = dict(
            hidden_size=text.hidden_size,
            vocab_size=text.vocab_size,
            intermediate_size=text.intermediate_size,
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None),
            head_dim=getattr(text, "head_dim", None),
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_theta=rope_parameters(text)["rope_theta"],
            max_position_embeddings=getattr(text, "max_position_embeddings", 4096),
            hidden_act=hidden_activation(text),
            attention_bias=getattr(text, "attention_bias", False),
            target_num_hidden_layers=getattr(text, "num_hidden_layers", 0),
            target_name=target_name or getattr(target, "_name_or_path", ""),
        )
        if getattr(text, "model_type", "") == "qwen2":
            copied["qkv_bias"] = True  # Qwen2: q/k/v have a bias, o_proj does not
        copied.update(kwargs)
        return cls(**copied)


def check_confidence(thresholds: object, num_heads: int) -> str:
    """What is wrong with per-head draft-confidence thresholds ("" when nothing).

    Example: ([0.1, 0.2], 3) -> "needs one threshold per head (3), got 2".
    """
    if not isinstance(thresholds, list | tuple) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in thresholds
    ):
        return f"must be a list of numbers, got {thresholds!r}"
    if len(thresholds) != num_heads:
        return f"needs one threshold per head ({num_heads}), got {len(thresholds)}"
    if not all(0.0 <= x <= 1.0 for x in thresholds):
        return f"thresholds are probabilities in [0, 1], got {list(thresholds)}"
    return ""


def check_target_layers(layers: object, num_target_layers: int) -> str:
    """What is wrong with ``target_layers`` ("" when nothing); 0 layers = count unknown.

    Example: ([2, 15, 30], 30) -> "layer 30 is not in [1, 29] (the target has 30 layers)".
    """
    if not isinstance(layers, list | tuple) or not layers:
        return f"must be a non-empty list of layer numbers, got {layers!r}"
    if not all(isinstance(j, int) and not isinstance(j, bool) for j in layers):
        return f"must be integers, got {list(layers)}"
    if list(layers) != sorted(set(layers)):
        return f"must be strictly increasing, got {list(layers)}"
    top = num_target_layers - 1 if num_target_layers else None
    for j in layers:
        if j < 1 or (top is not None and j > top):
            span = (
                ">= 1" if top is None else f"[1, {top}] (the target has {num_target_layers} layers)"
            )
            return f"layer {j} is not in {span}"
    return ""


def target_layers_problem(layers: object, target: Any) -> str:
    """``check_target_layers`` against a target's config (its text part's layer count)."""
    text = target.get_text_config() if hasattr(target, "get_text_config") else target
    return check_target_layers(layers, getattr(text, "num_hidden_layers", 0))


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"CloverConfig: {message}")
