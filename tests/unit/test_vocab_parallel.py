"""Tensor-parallel target tables: 2 gloo processes, each holding part of the vocabulary, draft
exactly what one process with the whole LM head drafts (float32, random trained-like weights).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import D, K, tiny_config
from vllm_clover.cpu.gemm import onednn_row_packer
from vllm_clover.modeling import CloverConfig, HeadLoop, TargetTables
from vllm_clover.modeling.vocab_parallel import VocabParallelTables

pytestmark = pytest.mark.unit

V, N = 50, 16  # vocab, batch rows (hidden D and heads K: the helpers' tiny config)
# (rank 0's rows [0, SPLIT), rank 1's [SPLIT, V)), uneven like vLLM's padded shards
SPLIT = 27
# per-head confidence thresholds that cut some chains of these random heads, not all
CONFIDENCE = torch.tensor([0.9, 0.9, 0.9])


def _config(**overrides) -> CloverConfig:
    """The tiny config of the helpers, V = 50, heads only (TP shards the head loop's tables)."""
    return tiny_config(vocab_size=V, use_augmenting_block=False, **overrides)


def _weights(cfg: CloverConfig, low_ids: bool = False) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Same random heads state, LM head and draft vocabulary in every process (seeded).

    low_ids: draw the draft vocabulary from rank 0's ids only.
    """
    gen = torch.Generator().manual_seed(0)
    heads = HeadLoop(cfg)
    state = {k: 0.3 * torch.randn(v.shape, generator=gen) for k, v in heads.state_dict().items()}
    lm_head = torch.randn(V, D, generator=gen)
    pool = SPLIT if low_ids else V
    draft_ids = torch.randperm(pool, generator=gen)[: cfg.draft_vocab_size or V].sort().values
    return state, lm_head, draft_ids


def _drafts(
    cfg: CloverConfig, state: dict, draft_ids: torch.Tensor, tables: TargetTables, scoring
) -> torch.Tensor:
    """The same head loop drafting through `tables` (whole or one rank's shard)."""
    heads = HeadLoop(cfg)
    heads.load_state_dict(state)
    if scoring is not None:  # rows in this format, packed as served on CPU
        tables.choose_scoring(scoring, onednn_row_packer())
    if cfg.draft_vocab_size:
        tables.set_draft_vocab(draft_ids)
    gen = torch.Generator().manual_seed(1)
    h0, t0 = torch.randn(N, D, generator=gen), torch.randint(0, V, (N,), generator=gen)
    full = heads.propose(h0, t0, K, tables)  # (N, K)
    cut = heads.propose(h0, t0, K, tables, CONFIDENCE)  # (N, K), -1 after a confidence stop
    return torch.cat([full, cut], dim=-1)  # (N, 2K)


def _reference(cfg: CloverConfig, low_ids: bool = False, scoring=None) -> torch.Tensor:
    state, lm_head, draft_ids = _weights(cfg, low_ids)
    tables = TargetTables(cfg)
    tables.attach(lm_head)
    return _drafts(cfg, state, draft_ids, tables, scoring)


def _rank_main(rank: int, port: int, cfg: CloverConfig, low_ids: bool, scoring, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        state, lm_head, draft_ids = _weights(cfg, low_ids)
        tables = VocabParallelTables(cfg)
        start, end = (0, SPLIT) if rank == 0 else (SPLIT, V)
        tables.attach_shard(lm_head[start:end], start)
        out[rank] = _drafts(cfg, state, draft_ids, tables, scoring)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded(cfg: CloverConfig, low_ids: bool = False, scoring=None) -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_main, args=(_free_port(), cfg, low_ids, scoring, out), nprocs=2, join=True)
        return dict(out)


# scoring: the format draft rows are scored in (None: the heads' float32 with PyTorch's matmul;
# "float32": packed into vLLM-CPU's oneDNN GEMM; "bfloat16": packed into oneDNN or the plugin's
# AVX2 GEMM, the CPU's default)
@pytest.mark.parametrize(
    "draft_vocab_size,scoring",
    [(None, None), (20, None), (5, None), (20, "bfloat16"), (20, "float32")],
)
def test_two_ranks_draft_what_one_process_drafts(draft_vocab_size, scoring):
    cfg = _config(draft_vocab_size=draft_vocab_size)
    reference = _reference(cfg, scoring=scoring)
    sharded = _sharded(cfg, scoring=scoring)
    assert torch.equal(sharded[0], reference) and torch.equal(sharded[1], reference)
    cut = reference[:, K:]
    assert bool((cut == -1).any()) and bool((cut[:, 0] != -1).any())  # the stop was exercised


def test_a_rank_without_draft_rows_still_takes_part():
    """Draft vocabulary entirely inside rank 0's shard: rank 1 scores nothing."""
    cfg = _config(draft_vocab_size=5)
    assert int(_weights(cfg, low_ids=True)[2].max()) < SPLIT
    sharded = _sharded(cfg, low_ids=True)
    assert torch.equal(sharded[0], sharded[1])
    assert torch.equal(sharded[0], _reference(cfg, low_ids=True))


def test_a_shard_that_does_not_fit_is_refused():
    tables = VocabParallelTables(_config())
    with pytest.raises(ValueError, match="does not fit vocab 50"):
        tables.attach_shard(torch.zeros(30, D), 25)
    with pytest.raises(TypeError, match="use attach_shard"):
        tables.attach(torch.zeros(V, D))
    with pytest.raises(NotImplementedError, match="not sharded"):
        tables.vocab_weight(torch.float32)
