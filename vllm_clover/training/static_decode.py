"""Decoding over a KV cache allocated once per wave of prompts: the hf engine's fast path.

The target's own decoder layers run over a cache allocated once per wave of left-padded
prompts, with an attention that reads each key/value head once; finished rows leave the
wave. Slot s of row b holds the token at position s - pad[b]; slots before pad[b] are
masked. Why and the layout: docs/training.md, "Self-distillation".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from vllm_clover.training.config import TrainingError

ATTENTION_NAME = "vllm_clover_grouped"
# Model types whose decoder is embed -> layers(hidden, mask, positions, cache, rope) -> norm:
# what ``forward_slots`` runs. Others keep transformers' generate (--hf-batching padded).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class Sampling:
    """How a wave draws its tokens: greedy at temperature 0, else from softmax(logits / T)."""

    max_new_tokens: int
    eos_ids: tuple[int, ...]
    pad_id: int
    temperature: float = 0.0
    rows_per_prefill: int = 64  # bounds prefill's (rows, heads, P, P) attention scores
    compact_every: int = 16  # steps between dropping finished rows (each costs a cache copy)


def grouped_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Grouped-query attention that reads each key/value head once (no ``repeat_kv``).

    query (B, nh, T, hs), key and value (B, nkv, L, hs), attention_mask (B, 1, T, L) bool
    (True: attend). Query head h uses key/value head h // (nh // nkv): a group's query heads
    become rows against the same keys. Returns ((B, T, nh, hs), None), as transformers'
    attention functions do."""
    B, nh, T, hs = query.shape
    nkv, L = key.shape[1], key.shape[2]
    g = nh // nkv
    scale = scaling if scaling is not None else hs**-0.5
    q = query.reshape(B, nkv, g * T, hs)  # rows r * T + t: group member r, query t
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # (B, nkv, g*T, L)
    mask = attention_mask.expand(B, g, T, L).reshape(B, 1, g * T, L)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, nkv, g*T, hs)
    return out.view(B, nh, T, hs).transpose(1, 2), None


class WaveCache:
    """Keys and values of one wave, (B, nkv, slots, hs) per layer, filled slot by slot.

    ``update`` is what transformers' attention layers call: it writes the new slots and returns
    every filled slot. ``rows`` gives a cache over some rows that shares this one's storage
    (prefill runs a few rows at a time)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], filled: int = 0):
        self.keys, self.values, self.filled = keys, values, filled

    @classmethod
    def allocate(cls, model: nn.Module, rows: int, slots: int) -> WaveCache:
        config, param = model.config, next(model.parameters())
        head_dim = model.model.layers[0].self_attn.head_dim  # what the layers will write
        shape = (rows, config.num_key_value_heads, slots, head_dim)
        layers = config.num_hidden_layers

        def make():
            return [param.new_empty(shape) for _ in range(layers)]

        return cls(make(), make())

    def rows(self, start: int, stop: int) -> WaveCache:
        return WaveCache([k[start:stop] for k in self.keys], [v[start:stop] for v in self.values])

    def update(self, key, value, layer_idx, *args, **kwargs):
        end = self.filled + key.shape[2]
        self.keys[layer_idx][:, :, self.filled : end] = key
        self.values[layer_idx][:, :, self.filled : end] = value
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices) stay: a copy of the cache, the old one freed."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


@contextmanager
def grouped_attention_in(model: nn.Module) -> Iterator[None]:
    """The model's attention layers call ``grouped_attention`` inside the block."""
    from transformers import AttentionInterface

    if model.config.model_type not in SUPPORTED_MODEL_TYPES:
        raise TrainingError(
            f"--hf-batching static runs {', '.join(SUPPORTED_MODEL_TYPES)} models, not "
            f"{model.config.model_type!r}; use --hf-batching padded"
        )
    AttentionInterface.register(ATTENTION_NAME, grouped_attention)
    before = model.config._attn_implementation
    model.config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before


def forward_slots(model, cache: WaveCache, ids, positions, mask) -> torch.Tensor:
    """The target over new slots: ids and positions (B, T), mask (B, 1, T, L) -> logits of
    the last slot (B, V). The slots are written to ``cache``, which then counts them filled."""
    body = model.model
    hidden = body.embed_tokens(ids)  # (B, T, D)
    rope = body.rotary_emb(hidden, positions)  # cos, sin: (B, T, hs)
    for layer in body.layers:
        out = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            position_embeddings=rope,
        )
        hidden = out[0] if isinstance(out, tuple) else out
    cache.filled += ids.shape[1]
    return model.get_output_embeddings()(body.norm(hidden[:, -1]))


def prefill(model, cache: WaveCache, ids: torch.Tensor, pad: torch.Tensor, rows: int):
    """Left-padded prompts ids (B, P) into ``cache``; logits of their last slot (B, V).

    Slot s attends to slots pad[b] <= s' <= s; a padding slot attends to itself alone, so that
    no row of scores is all masked (its values are never read by a real slot)."""
    B, P = ids.shape
    slot = torch.arange(P, device=ids.device)
    causal = slot[None, :] <= slot[:, None]  # (P, P): query slot, key slot
    itself = torch.eye(P, dtype=torch.bool, device=ids.device)
    logits = []
    for start in range(0, B, rows):
        part = slice(start, min(B, start + rows))
        real = slot[None, :] >= pad[part, None]  # (b, P)
        mask = (causal[None] & real[:, None, :]) | itself
        positions = (slot[None, :] - pad[part, None]).clamp(min=0)
        logits.append(
            forward_slots(
                model, cache.rows(part.start, part.stop), ids[part], positions, mask[:, None]
            )
        )
    cache.filled = P
    return torch.cat(logits)


def draw(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token per row (B,): argmax, or a sample from softmax(logits / T)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = (logits.float() / temperature).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def decode_wave(model, prompts: Sequence[Sequence[int]], sampling: Sampling, generator=None):
    """The new tokens of each prompt (EOS included where drawn), in order."""
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), sampling.pad_id, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
    ids = ids.to(device)
    pad = torch.tensor([P - len(p) for p in prompts], device=device)
    slots = P + sampling.max_new_tokens
    cache = WaveCache.allocate(model, B, slots)
    token = draw(
        prefill(model, cache, ids, pad, sampling.rows_per_prefill), sampling.temperature, generator
    )
    eos = torch.tensor(sampling.eos_ids, dtype=torch.long, device=device)
    out = torch.full((B, sampling.max_new_tokens), -1, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)  # wave row of each live row
    alive = torch.ones(B, dtype=torch.bool, device=device)
    valid = torch.arange(slots, device=device)[None, :] >= pad[:, None]  # (B, slots)
    for t in range(sampling.max_new_tokens):
        out[rows, t] = torch.where(alive, token, -1)
        alive &= ~torch.isin(token, eos)
        if t + 1 == sampling.max_new_tokens:
            break
        if (t + 1) % sampling.compact_every == 0:
            keep = alive.nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            if keep.numel() < rows.numel():
                cache.keep(keep)
                rows, alive, token, pad, valid = (x[keep] for x in (rows, alive, token, pad, valid))
        slot = P + t  # the slot of the token drawn at step t
        mask = valid[:, None, None, : slot + 1]
        positions = (slot - pad)[:, None]
        logits = forward_slots(model, cache, token[:, None], positions, mask)
        token = draw(logits, sampling.temperature, generator)
    return [[x for x in row if x >= 0] for row in out.tolist()]
