"""Shared front half of `train` and `eval-heads`: target, tokenised data, filled cache.

prepared = prepare(DataSpec(target="T", data="d.jsonl"), runtime, dtype)
prepared.train, prepared.eval   # TokenizedSequence lists (seeded split)
prepared.teacher_signal(seq)    # (hidden (T, D) bf16, top1 (T,)) from the cache
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vllm_clover.training.cache import HiddenStateCache
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import (
    Batch,
    TokenizedSequence,
    collate,
    load_conversations,
    split_train_eval,
    tokenize_all,
)
from vllm_clover.training.runtime import Runtime
from vllm_clover.training.teacher import Teacher, load_teacher, teacher_forward


@dataclass(frozen=True)
class DataSpec:
    """Which data, split and cache; the same fields mean the same thing in train/eval-heads."""

    target: str
    data: str | None = None
    max_samples: int | None = None
    max_seq_len: int = 1024
    eval_fraction: float = 0.02
    seed: int = 0
    cache_dir: str | None = None
    teacher_batch_tokens: int = 8192
    progress: bool = True

    @classmethod
    def from_config(cls, cfg: object) -> DataSpec:
        """The DataSpec fields of a TrainConfig / EvalConfig (same names, same meaning)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(cfg, n) for n in names if hasattr(cfg, n)})


@dataclass
class Prepared:
    teacher: Teacher
    train: list[TokenizedSequence]
    eval: list[TokenizedSequence]
    cache: HiddenStateCache

    def batch(self, sequences: list[TokenizedSequence]) -> Batch:
        return collate(sequences, [self.cache.get(s.key) for s in sequences])


def default_cache_root(cache_dir: str | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    from vllm_clover.assets.cache import cache_root

    return cache_root() / "hidden-states"


def prepare(
    spec: DataSpec, runtime: Runtime, dtype: torch.dtype, cache_train: bool = True
) -> Prepared:
    """Load the target, tokenise and split the data, and cache the hidden states it needs.

    With ``cache_train=False`` only the held-out split is cached (``eval-heads``). The caller
    releases the full target (``prepared.teacher.release()``) once it has what it needs.
    """
    teacher = load_teacher(spec.target, runtime.device, dtype)
    max_len = min(spec.max_seq_len, getattr(teacher.config, "max_position_embeddings", 1 << 30))
    source = spec.data or "the bundled ShareGPT set"
    conversations = load_conversations(spec.data, spec.max_samples)
    sequences = tokenize_all(teacher.tokenizer, conversations, max_len, source)
    train, held = split_train_eval(sequences, spec.eval_fraction, spec.seed)
    fingerprint = {
        "target_fingerprint": teacher.fingerprint,
        "teacher_dtype": str(dtype),
        "hidden_size": int(teacher.lm_head.shape[1]),
        "vocab_size": int(teacher.lm_head.shape[0]),
    }
    cache = HiddenStateCache(default_cache_root(spec.cache_dir), fingerprint)
    fill_cache(cache, teacher, (train if cache_train else []) + held, runtime, spec)
    return Prepared(teacher, train, held, cache)


def fill_cache(
    cache: HiddenStateCache,
    teacher: Teacher,
    sequences: list[TokenizedSequence],
    runtime: Runtime,
    spec: DataSpec,
) -> None:
    """Process r computes the missing ones among sequences r, r + world, ...; then all re-scan.

    The share is taken from the full list (not from what is missing when this process looks,
    which a faster process may already have changed), so every sequence has exactly one owner.
    """
    mine = cache.missing(sequences[runtime.rank :: runtime.world_size])
    if mine:
        cache.check_free_space(sum(len(s) for s in mine), int(teacher.lm_head.shape[1]))
    bar = tqdm(
        total=sum(len(s) for s in mine),
        unit="tok",
        desc="caching target hidden states",
        disable=not (spec.progress and runtime.is_main and mine),
    )

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return teacher_forward(teacher, ids.to(runtime.device), mask.to(runtime.device))

    try:
        cache.fill(mine, forward, spec.teacher_batch_tokens, bar.update)
    finally:
        bar.close()
    runtime.barrier()
    cache.refresh()
    absent = len(cache.missing(sequences))
    if absent:
        raise TrainingError(
            f"hidden-state cache {cache.dir}: {absent} sequence(s) still missing "
            "after filling (another process failed?)"
        )
