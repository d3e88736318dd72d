"""The target table the heads read (the LM head) and the draft vocabulary.

The head loop never owns a vocabulary-sized tensor: it reads the target's LM head W_lm (V, D),
shared and never copied whole, through ``TargetTables``, which also maps draft indices to
target ids, caches gathered rows and sets the format drafting scores them in. Tensor
parallelism swaps it for ``VocabParallelTables``. How it works, with a worked example:
docs/design/network.md, "The target's tables and the draft vocabulary: tables.py".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.scoring import PACKED_DTYPES, DraftRows, RowPacker

# ---------------------------------------------------------------------- scoring dtype policy
DRAFT_DTYPE_ENV = "CLOVER_DRAFT_DTYPE"
DRAFT_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DRAFT_DTYPE_CHOICES = ("auto", *DRAFT_DTYPES)


def draft_dtype_setting() -> str:
    """$CLOVER_DRAFT_DTYPE (default "auto"), or a ValueError naming the allowed values."""
    setting = os.environ.get(DRAFT_DTYPE_ENV, "auto")
    if setting not in DRAFT_DTYPE_CHOICES:
        raise ValueError(
            f"{DRAFT_DTYPE_ENV}={setting!r} is not one of {', '.join(DRAFT_DTYPE_CHOICES)}"
        )
    return setting


def cpu_scoring_dtype(packed: Collection[torch.dtype] = ()) -> torch.dtype:
    """The CPU's "auto" scoring format, given the row formats a packed GEMM takes (`packed`):
    packed bfloat16, else packed float32, else float16 (PyTorch's matmuls). Why this order:
    docs/design/network.md, "tables.py"."""
    for dtype in (torch.bfloat16, torch.float32):
        if dtype in packed:
            return dtype
    return torch.float16


def scoring_dtype_for(
    setting: str,
    target_dtype: torch.dtype,
    device_type: str,
    packed: Collection[torch.dtype] = (),
) -> torch.dtype:
    """The format drafting scores the draft-vocabulary rows in (never changes the output).

    "auto": on a CPU ``cpu_scoring_dtype(packed)``, elsewhere the target's dtype; any other
    setting is a key of DRAFT_DTYPES. Examples: docs/design/network.md, "tables.py"."""
    if setting == "auto":
        return cpu_scoring_dtype(packed) if device_type == "cpu" else target_dtype
    return DRAFT_DTYPES[setting]


def versions_key(*tensors: torch.Tensor | None) -> tuple:
    """What a value derived from these tensors depends on: identity, in-place version, dtype,
    device of each (None stays None). A cached value is stale when its key differs."""
    return tuple(None if t is None else (id(t), t._version, t.dtype, t.device) for t in tensors)


# ---------------------------------------------------------------------- the draft vocabulary
def draft_vocab_from_counts(token_counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids, sorted by id: (V,) -> (N,) int64."""
    top = torch.topk(token_counts.float(), draft_vocab_size).indices
    return top.sort().values.long()


def check_draft_vocab(token_ids: torch.Tensor, size: int, vocab_size: int) -> None:
    """ValueError unless token_ids is (size,) int64, strictly increasing, in [0, vocab_size)."""
    if token_ids.dim() != 1 or token_ids.numel() != size or token_ids.dtype != torch.int64:
        raise ValueError(
            f"draft_vocab_ids must be ({size},) int64, "
            f"got {tuple(token_ids.shape)} {token_ids.dtype}"
        )
    if size > 1 and not bool((token_ids[1:] > token_ids[:-1]).all()):
        raise ValueError("draft_vocab_ids must be unique and sorted by token id")
    if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size:
        raise ValueError(f"draft_vocab_ids must lie in [0, {vocab_size})")


# ---------------------------------------------------------------------- the tables
class TargetTables(nn.Module):
    """The target's LM head as the heads see it, via the draft vocab.

    Buffers: ``draft_vocab_ids`` (N,) int64, saved (None: full vocabulary); ``lm_head_weight``
    (V, D), shared, never saved (``attach`` it after any ``.to(dtype)``, which would copy it)."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        ids = torch.arange(config.draft_vocab_size) if config.draft_vocab_size else None
        self.register_buffer("draft_vocab_ids", ids, persistent=True)  # (N,) sorted target ids
        self.register_buffer("lm_head_weight", None, persistent=False)  # (V, D), shared
        self.scoring_dtype: torch.dtype | None = None  # None: score in the features' dtype
        self.row_packer: RowPacker | None = None  # packs float32 draft rows (choose_scoring)
        self._cache = VersionedCache()

    # ------------------------------------------------------------------ attaching
    def attach(self, lm_head_weight: torch.Tensor) -> None:
        """Share the target's LM head (V, D)."""
        expected = (self.config.vocab_size, self.config.hidden_size)
        if tuple(lm_head_weight.shape) != expected:
            raise ValueError(
                f"lm_head_weight has shape {tuple(lm_head_weight.shape)}, "
                f"expected (vocab, hidden) = {expected}"
            )
        self.lm_head_weight = lm_head_weight.detach()

    @property
    def lm_head(self) -> torch.Tensor:
        """The attached LM head (RuntimeError before ``attach``)."""
        if self.lm_head_weight is None:
            raise RuntimeError(
                "Clover: attach the target's LM head (attach_target / "
                "TargetTables.attach) before running the heads"
            )
        return self.lm_head_weight

    def choose_scoring(
        self,
        setting: str,
        packer: RowPacker | None = None,
        packed: Collection[torch.dtype] = PACKED_DTYPES,
    ) -> torch.dtype:
        """Set and return the drafting format for this LM head's dtype and device
        (``scoring_dtype_for``; setting as $CLOVER_DRAFT_DTYPE). A `packer` (the serving
        layer's GEMM) then packs the draft rows of the formats in `packed` (``DraftRows.of``)."""
        w = self.lm_head
        self.row_packer = packer
        formats = packed if packer is not None else ()
        self.scoring_dtype = scoring_dtype_for(setting, w.dtype, w.device.type, formats)
        return self.scoring_dtype

    # ------------------------------------------------------------------ vocabulary
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Set the (N,) draft vocabulary: unique target ids, strictly increasing."""
        if self.draft_vocab_ids is None:
            raise ValueError("draft_vocab_size is None: this model uses the full vocabulary")
        check_draft_vocab(token_ids, self.config.draft_vocab_size, self.config.vocab_size)
        self.draft_vocab_ids.copy_(token_ids)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab indices (any shape) -> target token ids. Identity for the full vocab."""
        return draft_ids if self.draft_vocab_ids is None else self.draft_vocab_ids[draft_ids]

    def target_to_draft(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape) -> draft-vocab indices, -1 where not in the draft vocab."""
        if self.draft_vocab_ids is None:
            return token_ids
        ids = self.draft_vocab_ids
        pos = torch.searchsorted(ids, token_ids).clamp_(max=ids.numel() - 1)
        return torch.where(ids[pos] == token_ids, pos, torch.full_like(pos, -1))

    # ------------------------------------------------------------------ rows
    def embed(self, token_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Regressive embedding of target ids (...,) -> (..., D) in ``dtype``: the W_lm row
        divided by its RMS."""
        rows = self.lookup_rows(token_ids).float()  # (..., D)
        rows = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return rows.to(dtype)

    def lookup_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows of W_lm (V, D) for ids (...,) -> (..., D); sharded under TP."""
        return F.embedding(token_ids, self.lm_head)

    def vocab_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The (N, D) rows of W_lm the heads score against, in ``dtype`` (training); gathered
        once and reused while neither changes. The full vocabulary is W_lm itself, never copied."""
        if self.draft_vocab_ids is None:
            return self.lm_head
        return self._cached(
            "vocab_weight",
            (dtype,),
            lambda: gathered_rows(self.lm_head, self.draft_vocab_ids).to(dtype),
        )

    def draft_rows(self, default_dtype: torch.dtype) -> DraftRows:
        """The same rows for drafting, in ``scoring_dtype`` (``default_dtype`` if unset);
        gathered once and cached like vocab_weight."""
        dtype = self.scoring_dtype or default_dtype
        return self._cached(
            "draft_rows",
            (dtype, self.row_packer),
            lambda: DraftRows.of(
                gathered_rows(self.lm_head, self.draft_vocab_ids), dtype, self.row_packer
            ),
        )

    def greedy_draft_ids(self, z: torch.Tensor, rows: DraftRows) -> torch.Tensor:
        """Draft-vocab indices of the best-scoring rows: head features (M, D) -> (M,) int64."""
        return rows.scores(z).argmax(dim=-1)

    def best_draft(self, z: torch.Tensor, rows: DraftRows) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft-vocab index (M,), its probability (M,)) of each row's best draft token; the
        probability is the head's softmax over the N draft rows (what training fits)."""
        return best_of(rows.logits(z))

    def _cached(self, name: str, key: tuple, build: Callable[[], Any]) -> Any:
        """build(), reused while the LM head, the vocabulary and ``key`` stay the same."""
        full_key = (versions_key(self.lm_head, self.draft_vocab_ids), *key)
        return self._cache.get(name, full_key, build)


def gathered_rows(lm_head: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """W_lm[ids] (N, D), or W_lm itself for the full vocabulary (ids None)."""
    return lm_head if ids is None else lm_head.index_select(0, ids)


def best_of(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (M,), softmax probability (M,)) of each row's best entry of logits (M, N)."""
    best = logits.max(dim=-1)
    return best.indices, torch.exp(best.values - torch.logsumexp(logits, dim=-1))


class VersionedCache:
    """Values derived from tensors, each kept under a name with the key it was built for
    (``versions_key``) and rebuilt when the key changes."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, Any]] = {}

    def get(self, name: str, key: tuple, build: Callable[[], Any]) -> Any:
        entry = self._entries.get(name)
        if entry is None or entry[0] != key:
            entry = (key, build())
            self._entries[name] = entry
        return entry[1]
