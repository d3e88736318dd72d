"""`vllm-clover make-heads` (make_heads.py): the train settings it derives, its results table.
The command end to end is in tests/engine/test_make_heads.py."""

from __future__ import annotations

import pytest

from vllm_clover.make_heads import MakeHeadsConfig, results_table, train_config, training_dtype

pytestmark = pytest.mark.unit


def test_train_settings_follow_the_working_folder_and_resume(tmp_path):
    cfg = MakeHeadsConfig(target="t", out=str(tmp_path), draft_vocab_size=8192, time_budget=2)
    train = train_config(cfg, vocab_size=4096)
    assert train.data == str(tmp_path / "data.jsonl") and train.out == str(tmp_path / "heads")
    assert train.draft_vocab_size == 4096  # capped at the target's vocabulary
    assert train.time_budget == 120 and train.save_every > 0 and train.resume is None
    (tmp_path / "heads.train-state").mkdir()  # an interrupted run left its state
    assert train_config(cfg).resume == str(tmp_path / "heads.train-state")


def test_the_results_table():
    figures = {
        "eval": {"top1": [0.5, 0.25], "tau": 1.62},
        "check": {
            "prompts": 8,
            "identical": 8,
            "tau": 1.5,
            "acceptance": [0.4, 0.1],
            "vanilla_tokens_per_s": 10.0,
            "clover_tokens_per_s": 12.5,
            "speedup": 1.25,
        },
    }
    table = results_table(figures)
    assert "| held-out answers: top-1 per head | 0.50 0.25 |" in table
    assert "| through vLLM, 8 unseen prompts: tau | 1.50 |" in table
    assert "10.0 -> 12.5 (1.25x)" in table and "| greedy outputs equal to vanilla | 8/8 |" in table


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ("avx2 fma", "float32"),  # AVX2-only EPYC: bfloat16 ran the teacher ~12x slower
        ("avx2 avx512f", "float32"),  # AVX-512 without bf16 units: oneDNN emulates bf16
        ("avx2 avx512f avx512_bf16", "bfloat16"),
        ("avx2 avx512f avx512_bf16 amx_bf16", "bfloat16"),
    ],
)
def test_dtype_auto_is_bfloat16_only_where_the_cpu_multiplies_it(monkeypatch, flags, dtype):
    from vllm_clover.cpu import isa

    monkeypatch.setenv(isa.FLAGS_ENV, flags)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    isa.cpu_flags.cache_clear()
    try:
        assert training_dtype("auto") == dtype
        assert train_config(MakeHeadsConfig(target="t", out="o")).dtype == dtype
        assert training_dtype("bfloat16") == "bfloat16"  # an explicit choice stands
    finally:
        isa.cpu_flags.cache_clear()
