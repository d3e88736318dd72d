"""The training split's teacher signal computed batch by batch, for data too large to cache.

The hidden-state cache costs 1.08 GiB per million tokens at D = 576 (H in bfloat16 and an
int32 argmax), so the whole bundled ShareGPT set at 1,024 tokens (14M) would take 15 GiB and a
larger target or data set far more. Past ``STREAM_ABOVE_GIB`` of new shards (or with
``--teacher-signal stream``) ``prepare`` keeps the target loaded and the trainer asks this
stream for each micro-batch instead; the held-out split is still cached (it is small and
evaluated many times).

A streamed signal is what the cache would hold: H rounded to the cache's bfloat16, the argmax
as int32, the same padding-invariant forward, so a streamed run trains the same heads as a
cached one (``tests/unit/test_training_trainer.py``). It costs one target forward per
sequence per epoch instead of one per data set: with one epoch, the usual budget at this
scale, the two cost the same.
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
