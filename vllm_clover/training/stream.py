"""The training split's teacher signal computed batch by batch, for data too large to cache:
past ``STREAM_ABOVE_GIB`` of new shards (or ``--teacher-signal stream``) the trainer asks it
for each micro-batch. A streamed signal is what the cache would hold, so a streamed run
trains the same heads as a cached one.
How it works: docs/design/training-internals.md, "Streaming the teacher signal".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from vllm_clover.training.cache import CACHE_DTYPE, bucketed, padded_batch
from vllm_clover.training.data import TokenizedSequence
from vllm_clover.training.teacher import Teacher, teacher_forward

# Stream rather than cache when the new shards would take more than this (GiB).
STREAM_ABOVE_GIB = 20.0


class TeacherStream:
    """(hidden (T, D) bf16, top1 (T,) int32) per sequence, from one target forward per call."""

    def __init__(
        self,
        teacher: Teacher,
        device: torch.device,
        rows: torch.Tensor | None = None,
        compiled: nn.Module | None = None,
        length_bucket: int = 1,
        layers: Sequence[int] = (),
    ) -> None:
        self.teacher, self.device, self.rows = teacher, device, rows
        self.compiled, self.length_bucket, self.layers = compiled, length_bucket, tuple(layers)

    def signal(
        self, sequences: Sequence[TokenizedSequence]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        width = bucketed(max(len(s) for s in sequences), self.length_bucket)
        ids, mask = padded_batch(sequences, width, len(sequences))  # (B, T)
        hidden, top1 = teacher_forward(
            self.teacher,
            ids.to(self.device),
            mask.to(self.device),
            self.rows,
            self.compiled,
            self.layers,
        )  # (B, T, (1 + A) * D), (B, T)
        return [
            (hidden[i, : len(s)].to(CACHE_DTYPE).cpu(), top1[i, : len(s)].to(torch.int32).cpu())
            for i, s in enumerate(sequences)
        ]
