"""Shared front half of `train` and `eval-heads`: target, tokenised data, filled cache.

``prepare`` returns the seeded split and ``batch(sequences)`` with their teacher signal; the
held-out split's argmax is always over the full vocabulary, so every evaluation is exact.
How it works: docs/design/training-internals.md, "Pipeline".
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vllm_clover.modeling import draft_vocab_from_counts
from vllm_clover.modeling.config import target_layers_problem
from vllm_clover.training.cache import HiddenStateCache, shard_bytes
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import (
    Batch,
    TokenizedSequence,
    collate,
    load_conversations,
    split_train_eval,
    token_counts,
    tokenize_all,
)
from vllm_clover.training.runtime import Runtime, return_freed_memory
from vllm_clover.training.stream import STREAM_ABOVE_GIB, TeacherStream
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
    compile_teacher: bool = False
    teacher_signal: str = "auto"
    progress: bool = True
    draft_vocab_size: int | None = None
    train_argmax: str = "full"
    target_layers: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, cfg: object) -> DataSpec:
        """The DataSpec fields of a TrainConfig / EvalConfig (same names, same meaning)."""
        names = [f.name for f in dataclasses.fields(cls)]
        fields = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
        fields["target_layers"] = tuple(fields.get("target_layers") or ())
        return cls(**fields)

    def signal_width(self, hidden_size: int) -> int:
        """Values per token of the signal: D, or (1 + A) * D with A target layers.

        Example: D = 576, target_layers (2, 15, 27) -> 2304 = [H | L_2 | L_15 | L_27]."""
        return hidden_size * (1 + len(self.target_layers))


# `train_argmax="auto"` covers only the draft rows above this vocabulary size (Gemma 3, Qwen2)
DRAFT_ARGMAX_MIN_VOCAB = 131072
# Padded lengths of a compiled teacher's batches are multiples of this (one compile each)
COMPILE_LENGTH_BUCKET = 128


@dataclass
class Prepared:
    teacher: Teacher
    train: list[TokenizedSequence]
    eval: list[TokenizedSequence]
    cache: HiddenStateCache  # full-vocabulary argmax: the held-out split, maybe the train split
    train_cache: HiddenStateCache  # the training split's signal (`cache` unless draft rows)
    draft_vocab_ids: torch.Tensor | None  # (N,) from the training split's token counts
    stream: TeacherStream | None = None  # the training split's signal when not cached
    target_layers: tuple[int, ...] = ()  # the target layers in every signal, after H

    def batch(self, sequences: list[TokenizedSequence]) -> Batch:
        """The full-vocabulary signal wherever the cache has it, else the training split's
        (cached, or streamed in one target forward for all the sequences not cached)."""
        signal: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for s in sequences:
            source = self.cache if s.key in self.cache else self.train_cache
            if s.key in source:
                signal[s.key] = source.get(s.key)
        rest = [s for s in sequences if s.key not in signal]
        if rest:
            if self.stream is None:
                raise RuntimeError(f"{len(rest)} sequence(s) neither cached nor streamed")
            signal.update(zip([s.key for s in rest], self.stream.signal(rest), strict=True))
        return collate(sequences, [signal[s.key] for s in sequences])

    def release_teacher(self) -> None:
        """Drop the full target once the heads are built, unless it streams the signal."""
        if self.stream is None:
            self.teacher.release()


def argmax_rows_for(
    spec: DataSpec, vocab_size: int, draft_ids: torch.Tensor | None
) -> torch.Tensor | None:
    """The LM-head rows of the training split's cached argmax: None = all of them."""
    if draft_ids is None or spec.train_argmax == "full":
        return None
    if spec.train_argmax == "auto" and vocab_size <= DRAFT_ARGMAX_MIN_VOCAB:
        return None
    return draft_ids


def default_cache_root(cache_dir: str | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    from vllm_clover.assets.cache import cache_root

    return cache_root() / "hidden-states"


def prepare(
    spec: DataSpec,
    runtime: Runtime,
    dtype: torch.dtype,
    cache_train: bool = True,
    draft_ids: torch.Tensor | None = None,
    check: Callable[[Teacher], None] | None = None,
) -> Prepared:
    """Load the target, tokenise and split the data, and cache the hidden states it needs.

    Draft vocabulary: ``draft_ids`` (``--init-from``), else the training split's most frequent
    tokens. ``check`` runs on the target before any data is read (``network.preflight``).
    ``cache_train=False`` caches the held-out split only (``eval-heads``); past STREAM_ABOVE_GIB
    the training split streams. The caller then calls ``prepared.release_teacher()``."""
    teacher = load_teacher(spec.target, runtime.device, dtype)
    check_layers_exist(spec, teacher)
    if check is not None:
        check(teacher)
    max_len = min(spec.max_seq_len, getattr(teacher.config, "max_position_embeddings", 1 << 30))
    source = spec.data or "the bundled ShareGPT set"
    conversations = load_conversations(spec.data, spec.max_samples)
    sequences = tokenize_all(teacher.tokenizer, conversations, max_len, source)
    train, held = split_train_eval(sequences, spec.eval_fraction, spec.seed)
    vocab_size = int(teacher.lm_head.shape[0])
    if draft_ids is None and spec.draft_vocab_size:
        counts = token_counts(train, vocab_size)
        draft_ids = draft_vocab_from_counts(counts, spec.draft_vocab_size)
    fingerprint = cache_fingerprint(teacher, dtype, spec.target_layers)
    width = spec.signal_width(int(teacher.lm_head.shape[1]))
    root = default_cache_root(spec.cache_dir)
    cache = train_cache = HiddenStateCache(root, fingerprint)
    rows = argmax_rows_for(spec, vocab_size, draft_ids)
    if rows is not None:
        rows_digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]
        train_cache = HiddenStateCache(root, {**fingerprint, "argmax_rows": rows_digest})
    to_cache = train if cache_train else []
    stream = None
    missing = [s for s in train_cache.missing(to_cache) if s.key not in cache]
    if missing and streams(spec, missing, width):
        compiled = compiled_teacher(teacher, spec)
        stream = TeacherStream(teacher, runtime.device, rows, *compiled, spec.target_layers)
        to_cache = []
    check_disk(root, [s for s in to_cache + held if s.key not in cache], width)
    if rows is None:
        fill_cache(cache, teacher, to_cache + held, runtime, spec)
    else:
        fill_cache(cache, teacher, held, runtime, spec)
        rest = [s for s in to_cache if s.key not in cache]
        fill_cache(train_cache, teacher, rest, runtime, spec, rows)
    return Prepared(teacher, train, held, cache, train_cache, draft_ids, stream, spec.target_layers)


def cache_fingerprint(
    teacher: Teacher, dtype: torch.dtype, layers: tuple[int, ...]
) -> dict[str, object]:
    """What the cached signal depends on (the cache folder is its hash)."""
    fingerprint: dict[str, object] = {
        "target_fingerprint": teacher.fingerprint,
        "teacher_dtype": str(dtype),
        "hidden_size": int(teacher.lm_head.shape[1]),
        "vocab_size": int(teacher.lm_head.shape[0]),
    }
    if layers:  # a cache of its own; H-only caches keep their fingerprint
        fingerprint["target_layers"] = list(layers)
    return fingerprint


def check_disk(root: Path, missing: list[TokenizedSequence], width: int) -> None:
    """TrainingError, naming --cache-dir, where the cache's disk cannot hold the new shards
    (their bfloat16 signal, with a tenth more for their token ids and index)."""
    need = int(1.1 * sum(len(s) for s in missing) * width * 2)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need > free:
        raise TrainingError(
            f"caching the target's signal needs about {need / 2**30:.1f} GiB at {root}, "
            f"where {free / 2**30:.1f} GiB are free: pass --cache-dir on a larger disk "
            f"(or fewer samples: --max-samples)"
        )


def check_layers_exist(spec: DataSpec, teacher: Teacher) -> None:
    """TrainingError before any caching when a target layer is not in the target."""
    if not spec.target_layers:
        return
    problem = target_layers_problem(list(spec.target_layers), teacher.config)
    if problem:
        raise TrainingError(f"--target-layers {list(spec.target_layers)}: {problem}")


def streams(spec: DataSpec, missing: list[TokenizedSequence], width: int) -> bool:
    """Whether the training split's signal is streamed: ``--teacher-signal stream``, or
    ``auto`` and its missing shards would take more than STREAM_ABOVE_GIB; ``width``: values
    per token of the signal (D, or (1 + A) * D with target layers)."""
    if spec.teacher_signal != "auto":
        return spec.teacher_signal == "stream"
    size = shard_bytes(sum(len(s) for s in missing), width) / 2**30
    if size <= STREAM_ABOVE_GIB:
        return False
    print(
        f"streaming the teacher signal of the training split: caching it would take "
        f"{size:.1f} GiB (over {STREAM_ABOVE_GIB:.0f}; --teacher-signal cache to cache anyway)",
        flush=True,
    )
    return True


def compiled_teacher(teacher: Teacher, spec: DataSpec) -> tuple[torch.nn.Module | None, int]:
    """(the target under torch.compile, the length bucket of its batches), or (None, 1):
    one graph per padded shape, so lengths go up in steps of COMPILE_LENGTH_BUCKET."""
    if not spec.compile_teacher:
        return None, 1
    return torch.compile(teacher.model, dynamic=False), COMPILE_LENGTH_BUCKET


def fill_cache(
    cache: HiddenStateCache,
    teacher: Teacher,
    sequences: list[TokenizedSequence],
    runtime: Runtime,
    spec: DataSpec,
    rows: torch.Tensor | None = None,
) -> None:
    """Process r computes the missing ones among sequences r, r + world, ...; then all re-scan.

    Shares come from the full list, not from what is missing when a process looks (a faster
    process may have changed that), so every sequence has exactly one owner."""
    mine = cache.missing(sequences[runtime.rank :: runtime.world_size])
    bar = tqdm(
        total=sum(len(s) for s in mine),
        unit="tok",
        desc="caching target hidden states" + (" (draft-row argmax)" if rows is not None else ""),
        disable=not (spec.progress and runtime.is_main and mine),
    )

    compiled, bucket = compiled_teacher(teacher, spec) if mine else (None, 1)

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = ids.to(runtime.device), mask.to(runtime.device)
        return teacher_forward(teacher, ids, mask, rows, compiled, spec.target_layers)

    try:
        cache.fill(mine, forward, spec.teacher_batch_tokens, bar.update, bucket)
    finally:
        bar.close()
    if mine:
        return_freed_memory()
    runtime.barrier()
    cache.refresh()
    absent = len(cache.missing(sequences))
    if absent:
        raise TrainingError(
            f"hidden-state cache {cache.dir}: {absent} sequence(s) still missing "
            "after filling (another process failed?)"
        )
