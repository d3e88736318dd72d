"""What `train` checks about the target before any data work (training/network.py preflight),
and the network it builds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tiny_targets import build_tiny_target, synthetic_conversations, torch_threads, write_jsonl
from vllm_clover.training import TrainConfig, TrainingError, train

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> dict[str, Path]:
    """A tiny Gemma 3 target, whose last layer the Augmenting Block cannot mirror."""
    root = tmp_path_factory.mktemp("gemma")
    conversations = synthetic_conversations(24, seed=0)
    target = build_tiny_target(
        root / "target", conversations, hidden_size=128, architecture="gemma3"
    )
    return {"target": target, "data": write_jsonl(root / "data.jsonl", conversations), "root": root}


def config(paths: dict[str, Path], **overrides) -> TrainConfig:
    fields = dict(
        target=str(paths["target"]),
        data=str(paths["data"]),
        out=str(paths["root"] / "heads"),
        cache_dir=str(paths["root"] / "cache"),
        overwrite=True,
        epochs=1,
        max_seq_len=64,
        eval_every=0,
        save_every=0,
        progress=False,
    )
    return TrainConfig(**{**fields, **overrides})


def cached_files(paths: dict[str, Path]) -> list[Path]:
    """The cache's shards of hidden states (its index aside)."""
    cache = paths["root"] / "cache"
    files = cache.rglob("*") if cache.exists() else []
    return [p for p in files if p.is_file() and p.name != "index.json"]


def test_a_block_the_target_cannot_mirror_is_refused_before_any_teacher_work(gemma):
    """In seconds, naming the flag that fixes it; nothing was cached."""
    started = time.monotonic()
    with torch_threads(1), pytest.raises(TrainingError, match="--no-augmenting-block"):
        train(config(gemma))
    assert time.monotonic() - started < 30
    assert cached_files(gemma) == []


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_first(gemma):
    with torch_threads(1), pytest.raises(TrainingError, match="--draft-vocab-size 100000"):
        train(config(gemma, augmenting_block=False, draft_vocab_size=100_000))
    assert cached_files(gemma) == []


def test_a_cache_disk_too_small_is_refused_naming_cache_dir(gemma, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 20, 1 << 20, 1000))
    with torch_threads(1), pytest.raises(TrainingError, match="pass --cache-dir on a larger disk"):
        train(config(gemma, augmenting_block=False))
    assert cached_files(gemma) == []


def test_without_the_block_the_same_target_trains(gemma):
    with torch_threads(1):
        result = train(config(gemma, augmenting_block=False, num_heads=2))
    assert (Path(result.out) / "model.safetensors").is_file()
