"""Content-addressed on-disk cache of the target's hidden states (bf16), reused across runs.

One folder per fingerprint (target weights, teacher dtype, sizes), one key per sequence (the
sha256 of its token ids), so a stale entry can never be hit; shards are written atomically.
Layout and rules: docs/design/training-internals.md, "The hidden-state cache".
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from vllm_clover.fsutil import atomic_write_bytes
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import TokenizedSequence

FORMAT_VERSION = 1
CACHE_DTYPE = torch.bfloat16
SHARD_TOKENS = 1 << 18  # a shard holds about this many tokens (~300 MB at D = 576)


class HiddenStateCache:
    """Look up, compute and store (hidden (T, D), top1 (T,)) per sequence key."""

    def __init__(self, root: Path, fingerprint: dict[str, object]) -> None:
        blob = json.dumps({"format": FORMAT_VERSION, **fingerprint}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        self.dir = Path(root) / digest
        self.fingerprint = json.loads(blob)
        self._where: dict[str, tuple[Path, int, int]] = {}  # key -> (shard, start, length)
        self._handles: dict[Path, object] = {}
        self._open_index()
        self.refresh()

    def _open_index(self) -> None:
        index = self.dir / "index.json"
        try:
            if index.is_file():
                if json.loads(index.read_text()) != self.fingerprint:
                    raise TrainingError(
                        f"{index}: fingerprint differs from its folder name; "
                        "delete this cache folder"
                    )
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(index, (json.dumps(self.fingerprint, indent=2) + "\n").encode())
        except (OSError, json.JSONDecodeError) as err:
            raise TrainingError(f"cannot use hidden-state cache {self.dir}: {err}") from err

    def refresh(self) -> None:
        """(Re)scan the shard headers (after another process added shards).

        A key held by several shards is read from the earliest-written one, in every process,
        so a resumed run reads the signal its first process read."""
        found = {s: written_order(s) for s in self.dir.glob("shard-*.safetensors")}
        for shard, order in sorted(found.items(), key=lambda item: item[1]):
            if shard in self._handles:
                continue
            try:
                handle = safe_open(shard, framework="pt")
                meta = handle.metadata() or {}
                keys, lengths = json.loads(meta["keys"]), json.loads(meta["lengths"])
            except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as err:
                raise TrainingError(
                    f"corrupt hidden-state cache shard {shard} ({err}); delete it and run again"
                ) from err
            self._handles[shard] = handle
            start = 0
            for key, length in zip(keys, lengths, strict=True):
                held = self._where.get(key)
                if held is None or order < found[held[0]]:
                    self._where[key] = (shard, start, length)
                start += length

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def missing(self, sequences: Sequence[TokenizedSequence]) -> list[TokenizedSequence]:
        seen: set[str] = set()
        out = []
        for seq in sequences:
            if seq.key not in self._where and seq.key not in seen:
                seen.add(seq.key)
                out.append(seq)
        return out

    def get(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden (T, D) bfloat16, top1 (T,) int32) of one cached sequence."""
        shard, start, length = self._where[key]
        handle = self._handles[shard]
        return (
            handle.get_slice("hidden")[start : start + length],
            handle.get_slice("top1")[start : start + length],
        )

    # ------------------------------------------------------------------ writing
    def write_shard(
        self, keys: list[str], hidden: list[torch.Tensor], top1: list[torch.Tensor]
    ) -> Path:
        """Store sequences (hidden (T_j, D), top1 (T_j,)) as one new shard, atomically."""
        final = self.dir / f"shard-{uuid.uuid4().hex}.safetensors"
        tmp = final.with_name(f".{final.name}.tmp")
        tensors = {
            "hidden": torch.cat(hidden).to(CACHE_DTYPE).cpu().contiguous(),
            "top1": torch.cat(top1).to(torch.int32).cpu().contiguous(),
        }
        meta = {
            "keys": json.dumps(keys),
            "lengths": json.dumps([len(t) for t in top1]),
            "format": str(FORMAT_VERSION),
        }
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, final)
        except OSError as err:
            reason = "out of disk space" if err.errno == errno.ENOSPC else "write failed"
            raise TrainingError(
                f"hidden-state cache {self.dir}: {reason} writing a shard "
                f"({err}); nothing partial was kept"
            ) from err
        finally:
            tmp.unlink(missing_ok=True)
        self.refresh()
        return final

    def fill(
        self,
        sequences: Sequence[TokenizedSequence],
        forward: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        batch_tokens: int,
        progress: Callable[[int], None] | None = None,
        length_bucket: int = 1,
    ) -> int:
        """Compute and store every sequence not yet cached, longest first; return how many.

        ``forward(ids (B, T), mask (B, T)) -> (H (B, T, D), top1 (B, T))`` on batches of at most
        ``batch_tokens`` padded tokens; ``length_bucket`` > 1: few shapes, for a compiled one."""
        todo = sorted(self.missing(sequences), key=len, reverse=True)
        pending: tuple[list[str], list[torch.Tensor], list[torch.Tensor]] = ([], [], [])
        i = 0
        while i < len(todo):
            width = bucketed(len(todo[i]), length_bucket)
            rows = max(1, batch_tokens // width)
            group = todo[i : i + rows]
            ids, mask = padded_batch(group, width, rows if length_bucket > 1 else len(group))
            hidden, top1 = forward(ids, mask)  # (B, T, D), (B, T)
            for row, seq in enumerate(group):
                pending[0].append(seq.key)
                pending[1].append(hidden[row, : len(seq)].to(CACHE_DTYPE).cpu())
                pending[2].append(top1[row, : len(seq)].cpu())
            if sum(len(t) for t in pending[2]) >= SHARD_TOKENS:
                self.write_shard(*pending)
                pending = ([], [], [])
            if progress is not None:
                progress(sum(len(s) for s in group))
            i += len(group)
        if pending[0]:
            self.write_shard(*pending)
        return len(todo)


def shard_bytes(num_tokens: int, hidden_size: int) -> int:
    """Disk the shards take for ``num_tokens``: H (bfloat16) + argmax (int32) per token."""
    return num_tokens * (hidden_size * 2 + 4)


def bucketed(length: int, bucket: int) -> int:
    """``length`` rounded up to a multiple of ``bucket``. Example: (300, 128) -> 384."""
    return -(-length // bucket) * bucket


def written_order(shard: Path) -> tuple[int, str]:
    """Sort key of a shard by when it was written (its name breaks ties)."""
    return shard.stat().st_mtime_ns, shard.name


def padded_batch(
    group: Sequence[TokenizedSequence], width: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (rows, T), mask (rows, T)) of ``group`` right-padded to T = max(width, longest).

    Rows past the group are filler (token 0, mask all True: a row with no key to attend to
    would give NaN), so a bucketed batch always has the same shape."""
    width = max(width, max(len(s) for s in group))
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.ones(rows, width, dtype=torch.bool)
    for row, seq in enumerate(group):
        ids[row, : len(seq)] = seq.input_ids
        mask[row, len(seq) :] = False
    return ids, mask
