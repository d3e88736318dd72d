"""Tiny random targets (Llama and other architectures), a ChatML tokenizer, synthetic data.

For tests, smoke runs and docs: builds in well under a second, no network::

    paths = tiny_workspace(tmp)    # {"target": HF folder, "data": JSONL, "cache": folder}
    train(TrainConfig(target=str(paths["target"]), data=str(paths["data"]), out=...))
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vllm_clover.assets.data import Conversation, Message

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
    "rho sigma tau upsilon phi chi psi omega red green blue one two three four five"
).split()


def synthetic_conversations(n: int, seed: int = 0, turns: int = 1) -> list[Conversation]:
    """n conversations: the user lists words, the assistant repeats them in a fixed pattern."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = []
        for _ in range(turns):
            words = rng.sample(WORDS, rng.randint(4, 9))
            messages.append(Message("user", "repeat: " + " ".join(words)))
            messages.append(Message("assistant", " ".join(words + sorted(words)) + " done"))
        out.append(Conversation(f"syn-{i}", tuple(messages)))
    return out


def write_jsonl(path: Path, conversations: Sequence[Conversation]) -> Path:
    """Our {id, messages} JSONL format (the cached ShareGPT set's, ``fetch_sharegpt``)."""
    lines = [json.dumps({"id": c.id, "messages": c.as_chat()}) for c in conversations]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(path)


def build_tiny_tokenizer(texts: Sequence[str], vocab_size: int = 300):
    """Byte-level BPE trained on ``texts`` with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


# Tiny configs of other architectures (their own fields; shapes are set by build_tiny_target).
ARCHITECTURE_FIELDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q/k/v biases
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),  # fused qkv_proj, gate_up_proj
    "gemma3": (  # offset norms, q/k norms, GELU, scaled embeddings, per-layer-type RoPE
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 64,
            "query_pre_attn_scalar": 32,
            "tie_word_embeddings": True,
        },
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),  # norms after the sublayers, q/k norms
    "gemma2": (  # soft-capped logits: the heads cannot serve it at all
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"final_logit_softcapping": 30.0, "query_pre_attn_scalar": 32},
    ),
}


def tiny_target_config(
    architecture: str, vocab_size: int, hidden_size: int = 64, init_std: float = 0.2, **extra: Any
) -> tuple[Any, type]:
    """(config, model class) of a 2-layer random causal LM of ``architecture`` (GQA 4/2)."""
    import transformers

    config_name, model_name, fields = ARCHITECTURE_FIELDS[architecture]
    shape = {
        "hidden_size": hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // 4,
        "intermediate_size": 2 * hidden_size,
        "vocab_size": vocab_size,
        "max_position_embeddings": 512,
        "initializer_range": init_std,
        "tie_word_embeddings": False,
    }
    config = getattr(transformers, config_name)(**{**shape, **extra, **fields})
    return config, getattr(transformers, model_name)


def build_tiny_target(
    out: Path,
    conversations: Sequence[Conversation],
    seed: int = 0,
    hidden_size: int = 64,
    init_std: float = 0.2,
    architecture: str = "llama",
) -> Path:
    """Save a 2-layer random causal LM (GQA 4/2) of ``architecture`` + tokenizer to ``out``.

    ``init_std`` is large so that the random target has peaked, learnable distributions.
    hidden_size 128 gives head_dim 32, which vLLM's CPU attention supports (64 does not).
    """
    import torch

    texts = [m.content for c in conversations for m in c.messages]
    tokenizer = build_tiny_tokenizer(texts)
    special = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    config, model_class = tiny_target_config(
        architecture, len(tokenizer), hidden_size, init_std, **special
    )
    torch.manual_seed(seed)
    model_class(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


def tiny_workspace(root: Path, num_conversations: int = 24, seed: int = 0) -> dict[str, Path]:
    """Tiny target + data JSONL + empty cache root under ``root``: {"target", "data", "cache"}."""
    root = Path(root)
    conversations = synthetic_conversations(num_conversations, seed)
    return {
        "target": build_tiny_target(root / "target", conversations, seed),
        "data": write_jsonl(root / "data.jsonl", conversations),
        "cache": root / "cache",
    }


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run tiny models with ``n`` intra-op threads (on a shared 2-core box, one thread is far
    faster than two fighting another process), restoring the previous setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
