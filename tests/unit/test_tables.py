"""TargetTables: attaching the target, the draft vocabulary, the row caches, the scoring
format and its dtype policy ($CLOVER_DRAFT_DTYPE)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D, K, V, random_clover, tiny_config
from vllm_clover.modeling import CloverModel, TargetTables, shift_tokens_for_heads
from vllm_clover.modeling.scoring import PACKED_DTYPES
from vllm_clover.modeling.tables import (
    DRAFT_DTYPE_ENV,
    check_draft_vocab,
    draft_dtype_setting,
    draft_vocab_from_counts,
    scoring_dtype_for,
)

pytestmark = pytest.mark.unit
IDS = torch.arange(16) * 3  # a draft vocabulary of 16 ids


def tables_with(lm_head: torch.Tensor, **overrides) -> TargetTables:
    tables = TargetTables(tiny_config(draft_vocab_size=16, **overrides))
    tables.set_draft_vocab(IDS)
    tables.attach(lm_head)
    return tables


def test_attach_checks_shapes_and_shares_the_tensors() -> None:
    tables = TargetTables(tiny_config())
    with pytest.raises(RuntimeError, match="attach the target's LM head"):
        tables.draft_rows(torch.float32)
    with pytest.raises(ValueError, match="shape"):
        tables.attach(torch.randn(V + 1, D))
    lm_head = torch.randn(V, D)
    tables.attach(lm_head)
    assert tables.lm_head.data_ptr() == lm_head.data_ptr()  # shared, not copied
    assert "lm_head_weight" not in tables.state_dict()


def test_draft_vocabulary_mapping_worked_example() -> None:
    """The worked example of docs/design/network.md, "tables.py"."""
    tables = TargetTables(tiny_config(vocab_size=10, draft_vocab_size=3))
    tables.set_draft_vocab(torch.tensor([2, 5, 9]))
    assert tables.draft_to_target(torch.tensor([0, 2, 1])).tolist() == [2, 9, 5]
    assert tables.target_to_draft(torch.tensor([5, 3, 9])).tolist() == [1, -1, 2]
    with pytest.raises(ValueError, match="sorted"):
        tables.set_draft_vocab(torch.tensor([9, 5, 2]))
    with pytest.raises(ValueError, match="full vocabulary"):
        TargetTables(tiny_config()).set_draft_vocab(torch.tensor([1, 2]))


def test_draft_vocabulary_logits_are_columns_of_the_full_ones() -> None:
    draft, lm_head = random_clover(tiny_config(draft_vocab_size=40))
    full = CloverModel(tiny_config())
    state = {k: v for k, v in draft.checkpoint_state().items() if k != "draft_vocab_ids"}
    full.load_checkpoint_state(state)
    full.attach_target(lm_head)
    hidden, tok = torch.randn(2, 5, D), torch.randint(0, V, (2, 5))
    head_inputs = shift_tokens_for_heads(tok, K).input_ids
    ids = draft.tables.draft_vocab_ids
    torch.testing.assert_close(
        draft(hidden, head_inputs), full(hidden, head_inputs)[..., ids], rtol=0, atol=1e-6
    )


def test_the_regressive_embedding_is_the_rms_normalised_lm_head_row() -> None:
    lm_head = torch.randn(V, D)
    tables = TargetTables(tiny_config())
    tables.attach(lm_head)
    e = tables.embed(torch.tensor([3, 7]), torch.float32)
    torch.testing.assert_close(e.pow(2).mean(-1), torch.ones(2), rtol=0, atol=1e-4)
    torch.testing.assert_close(e[0] / e[0].norm(), lm_head[3] / lm_head[3].norm())


def test_training_rows_are_gathered_once_and_refreshed_on_change() -> None:
    lm_head = torch.randn(V, D)
    tables = tables_with(lm_head)
    first = tables.vocab_weight(torch.float32)
    assert tables.vocab_weight(torch.float32) is first  # cached between steps
    assert torch.equal(first, lm_head[IDS])
    tables.draft_vocab_ids.copy_(torch.arange(16))  # e.g. load_state_dict, in place
    assert torch.equal(tables.vocab_weight(torch.float32), lm_head[:16])
    other = torch.randn(V, D)
    tables.attach(other)
    assert torch.equal(tables.vocab_weight(torch.float32), other[:16])
    assert tables.vocab_weight(torch.bfloat16).dtype == torch.bfloat16


def test_bf16_heads_score_bf16_rows_of_an_fp32_lm_head() -> None:
    """Drafting in bf16 on an fp32 target: the gathered rows follow the heads' dtype."""
    model = CloverModel(tiny_config(draft_vocab_size=16)).to(torch.bfloat16)
    model.tables.set_draft_vocab(IDS)
    lm_head = torch.randn(V, D)  # the target's, float32, shared
    model.attach_target(lm_head)
    rows = model.tables.draft_rows(model.dtype)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows.weight, lm_head[IDS].bfloat16())
    drafts = model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2)  # fp32 h0 in
    assert drafts.shape == (3, 2) and drafts.dtype == torch.int64
    assert set(drafts.flatten().tolist()) <= set(IDS.tolist())


@pytest.mark.parametrize("scoring", [torch.bfloat16, torch.float16])
def test_drafting_scores_its_own_copy_of_the_rows(scoring: torch.dtype) -> None:
    """scoring_dtype sets the drafting format; training keeps rows in the heads' dtype."""
    model, lm_head = random_clover(tiny_config(draft_vocab_size=16))
    model.tables.set_draft_vocab(IDS)
    model.tables.scoring_dtype = scoring
    rows = model.tables.draft_rows(model.dtype)
    assert model.dtype == torch.float32 and rows.dtype == scoring
    assert model.tables.draft_rows(model.dtype) is rows
    assert model.tables.vocab_weight(model.dtype).dtype == torch.float32
    z = torch.randn(5, D)
    expected = F.linear(z.to(scoring), rows.weight).float()
    torch.testing.assert_close(rows.scores(z).float(), expected, rtol=1e-2, atol=1e-2)
    drafts = model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2)
    assert set(drafts.flatten().tolist()) <= set(IDS.tolist())


def test_auto_scoring_follows_the_cpus_packed_gemm_and_the_target_dtype_elsewhere():
    from vllm_clover.modeling.tables import cpu_scoring_dtype

    # bfloat16 wherever a packed GEMM takes it (oneDNN, or the plugin's AVX2 GEMM)
    assert cpu_scoring_dtype(PACKED_DTYPES) == torch.bfloat16
    assert cpu_scoring_dtype((torch.float32,)) == torch.float32  # oneDNN without bfloat16
    assert cpu_scoring_dtype(()) == torch.float16  # no packed GEMM: PyTorch's matmuls
    for target in (torch.float32, torch.bfloat16):
        assert scoring_dtype_for("auto", target, "cpu", PACKED_DTYPES) == torch.bfloat16
        assert scoring_dtype_for("auto", target, "cpu") == torch.float16
    assert scoring_dtype_for("auto", torch.float16, "cuda", PACKED_DTYPES) == torch.float16
    assert scoring_dtype_for("auto", torch.bfloat16, "cuda") == torch.bfloat16
    assert scoring_dtype_for("auto", torch.float32, "cuda") == torch.float32
    assert scoring_dtype_for("float32", torch.float32, "cpu") == torch.float32
    assert scoring_dtype_for("bfloat16", torch.float32, "cpu") == torch.bfloat16
    assert scoring_dtype_for("float32", torch.bfloat16, "cuda") == torch.float32
    assert scoring_dtype_for("float16", torch.bfloat16, "cuda") == torch.float16
    tables = tables_with(torch.randn(V, D))
    assert tables.choose_scoring("auto") == torch.float16 == tables.scoring_dtype  # no packer


def test_draft_dtype_setting_reads_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(DRAFT_DTYPE_ENV, raising=False)
    assert draft_dtype_setting() == "auto"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "bfloat16")
    assert draft_dtype_setting() == "bfloat16"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="CLOVER_DRAFT_DTYPE='fp8' is not one of auto, float32"):
        draft_dtype_setting()
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "int8")  # int8 draft rows are gone
    accepted = "is not one of auto, float32, bfloat16, float16$"
    with pytest.raises(ValueError, match=f"CLOVER_DRAFT_DTYPE='int8' {accepted}"):
        draft_dtype_setting()


def test_draft_vocab_from_counts_and_its_check():
    counts = torch.rand(V)
    ids = draft_vocab_from_counts(counts, 40)
    assert torch.equal(ids, torch.topk(counts, 40).indices.sort().values)
    check_draft_vocab(ids, 40, V)
    with pytest.raises(ValueError, match="sorted"):
        check_draft_vocab(ids.flip(0), 40, V)
    with pytest.raises(ValueError, match=r"\(40,\) int64"):
        check_draft_vocab(ids[:39], 40, V)
    with pytest.raises(ValueError, match=r"lie in \[0, 120\)"):
        check_draft_vocab(torch.cat([ids[:39], torch.tensor([V])]), 40, V)


def test_a_packer_packs_the_float32_draft_rows_once() -> None:
    """choose_scoring with a packer (the serving layer's GEMM): float32 rows go through it,
    packed when the rows are first gathered and reused after (bfloat16 rows alike,
    tests/unit/test_cpu_gemm.py)."""
    model, _ = random_clover(tiny_config(draft_vocab_size=16))
    model.tables.set_draft_vocab(IDS)
    packed = []

    def packer(rows: torch.Tensor):
        packed.append(rows.clone())
        return lambda z: F.linear(z, packed[0])

    model.tables.choose_scoring("float32", packer)
    rows = model.tables.draft_rows(model.dtype)
    assert rows.kernel is not None and model.tables.draft_rows(model.dtype) is rows
    assert len(packed) == 1 and torch.equal(packed[0], model.tables.vocab_weight(torch.float32))
    model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2)
    assert len(packed) == 1
    model.tables.choose_scoring("float16", packer)  # other formats are scored by torch
    assert model.tables.draft_rows(model.dtype).kernel is None
