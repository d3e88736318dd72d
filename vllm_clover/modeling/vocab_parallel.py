"""The target tables on one tensor-parallel rank: the vocabulary split by rows.

Rank r holds the LM-head rows of ids [start_r, end_r); the head loop's D x D layers are
replicated. Only the regressive embedding (an all-reduce) and the best draft (an all-gather of
each rank's best) cross ranks; the (V, D) head is never gathered. Drafting only: training
logits are not sharded. How it works: docs/design/network.md, "vocab_parallel.py".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.scoring import DraftRows
from vllm_clover.modeling.tables import TargetTables


class VocabParallelTables(TargetTables):
    """`TargetTables` holding one rank's row shard [vocab_start, vocab_end) of the target."""

    def __init__(self, config: CloverConfig, group: dist.ProcessGroup | None = None) -> None:
        super().__init__(config)
        self.group = group  # the tensor-parallel group (None: the default group)
        self.vocab_start, self.vocab_end = 0, config.vocab_size
        self.first_draft_index = 0  # draft index of this rank's first draft row

    def attach(self, lm_head_weight: torch.Tensor) -> None:
        raise TypeError("VocabParallelTables holds a shard: use attach_shard")

    def attach_shard(self, lm_head_shard: torch.Tensor, vocab_start: int) -> None:
        """Share this rank's rows (n, D) of the target's LM head, ids [vocab_start, +n); pass
        the rows of real ids only (drop vLLM's vocabulary padding)."""
        n, d = lm_head_shard.shape
        if d != self.config.hidden_size or not 0 <= vocab_start <= vocab_start + n <= (
            self.config.vocab_size
        ):
            raise ValueError(
                f"LM-head shard {tuple(lm_head_shard.shape)} at id {vocab_start} "
                f"does not fit vocab {self.config.vocab_size} x hidden {d}"
            )
        self.vocab_start, self.vocab_end = vocab_start, vocab_start + n
        self.lm_head_weight = lm_head_shard.detach()

    def lookup_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Full rows (..., D) for ids (...,) from every rank's shard (one all-reduce)."""
        held = (token_ids >= self.vocab_start) & (token_ids < self.vocab_end)  # (...,)
        local = torch.where(held, token_ids - self.vocab_start, torch.zeros_like(token_ids))
        table = self.lm_head
        rows = F.embedding(local, table) * held.unsqueeze(-1).to(table.dtype)  # (..., D)
        dist.all_reduce(rows, group=self.group)
        return rows

    def vocab_weight(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError(
            "training logits are not sharded: vocab_weight would index "
            "this rank's shard with global draft ids"
        )

    def draft_rows(self, default_dtype: torch.dtype) -> DraftRows:
        """This rank's draft rows (n, D), n >= 0; cached like the base class's."""
        dtype = self.scoring_dtype or default_dtype
        return self._cached(
            "draft_rows",
            (dtype, self.vocab_start, self.row_packer),
            lambda: self._local_draft_rows(dtype),
        )

    def _local_draft_rows(self, dtype: torch.dtype) -> DraftRows:
        ids = self.draft_vocab_ids
        if ids is None:  # the draft index of a token is its id
            ids = torch.arange(self.config.vocab_size, device=self.lm_head.device)
        held = (ids >= self.vocab_start) & (ids < self.vocab_end)  # (N,), one run of True
        self.first_draft_index = int(held.int().argmax()) if bool(held.any()) else 0
        rows = self.lm_head.index_select(0, ids[held] - self.vocab_start)
        return DraftRows.of(rows, dtype, self.row_packer if rows.shape[0] else None)

    def greedy_draft_ids(self, z: torch.Tensor, rows: DraftRows) -> torch.Tensor:
        """Draft-vocab indices of the best rows over all ranks: z (M, D) -> (M,) int64; ties
        go to the lowest id, as unsharded (docs/design/network.md, "vocab_parallel.py")."""
        scores = rows.scores(z).float() if rows.weight.shape[0] else None  # (M, n)
        return self._best_over_ranks(z, scores, with_lse=False)[0]

    def best_draft(self, z: torch.Tensor, rows: DraftRows) -> tuple[torch.Tensor, torch.Tensor]:
        """As `TargetTables.best_draft`, over all ranks: the winner as in greedy_draft_ids,
        and p = exp(l_best - logsumexp over the ranks' own logsumexps)."""
        logits = rows.logits(z) if rows.weight.shape[0] else None  # (M, n)
        index, best, lse = self._best_over_ranks(z, logits, with_lse=True)
        return index, torch.exp(best - torch.logsumexp(lse, dim=0))

    def _best_over_ranks(
        self, z: torch.Tensor, scores: torch.Tensor | None, with_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(draft index (M,), its score (M,), every rank's logsumexp (world, M)) of the
        best row over all ranks, from this rank's scores (M, n), None if it holds no row.
        Without ``with_lse`` the logsumexps are neither computed nor gathered (None)."""
        if scores is not None:
            best = scores.argmax(dim=-1)  # (M,) first maximum = lowest id among ties
            score = scores.gather(-1, best[:, None]).squeeze(-1)
            index = self.first_draft_index + best
            lse = torch.logsumexp(scores, dim=-1) if with_lse else None
        else:  # this rank holds no draft row: -inf, as the logsumexp of no row
            score = z.new_full(z.shape[:1], float("-inf"), dtype=torch.float32)
            index = torch.zeros(z.shape[:1], dtype=torch.long, device=z.device)
            lse = score
        world = dist.get_world_size(self.group)
        local = (score, index, lse) if with_lse else (score, index)
        gathered = [[torch.empty_like(t) for _ in range(world)] for t in local]
        for out, t in zip(gathered, local, strict=True):
            dist.all_gather(out, t, group=self.group)
        scores_r, indices_r, *lse_r = (torch.stack(g) for g in gathered)  # (world, M) each
        winner = scores_r.argmax(dim=0)  # (M,) rank; lower ranks hold lower ids
        pick = winner[None]
        best = scores_r.gather(0, pick).squeeze(0)
        return indices_r.gather(0, pick).squeeze(0), best, (lse_r[0] if lse_r else None)
