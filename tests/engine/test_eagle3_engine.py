"""A `train-eagle3` folder through vLLM's own eagle3 method on the reference target: vLLM
accepts its drafts as often as the offline figures say it should (so the folder means to vLLM
what it meant in training: weights, layers, steps), and the outputs are vanilla's (float32).

The drafter learns the target's own answers to 8 prompts by heart, so that both figures are
large and far from what a drafter vLLM misreads would reach."""

from __future__ import annotations

import json

import pytest

from helpers import run_python
from tiny_targets import synthetic_conversations, write_jsonl
from vllm_clover.bench.check import serve_check
from vllm_clover.cli import main
from vllm_clover.eagle3.config import Eagle3TrainConfig
from vllm_clover.eagle3.train import train_eagle3
from vllm_clover.training.data import load_conversations

pytestmark = pytest.mark.engine

STEPS, TOKENS = 3, 32


def test_vllm_accepts_eagle3_drafts_as_offline_figures_say(reference_target, tmp_path) -> None:
    target = str(reference_target)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", synthetic_conversations(8, seed=3))
    answers = tmp_path / "answers.jsonl"
    args = ["generate-data", "--target", target, "--data", str(prompts), "--out", str(answers)]
    args += ["--max-turns", "1", "--max-new-tokens", str(TOKENS), "--dtype", "float32"]
    run_python(f"if __name__ == '__main__':\n    from vllm_clover.cli import main; main({args!r})")
    common = dict(target=target, data=str(answers), eval_fraction=0.0, max_seq_len=256)
    cache = str(tmp_path / "cache")
    drafter = tmp_path / "eagle3"
    train_eagle3(
        Eagle3TrainConfig(
            **common, out=str(drafter), draft_vocab_size=1024, ttt_steps=STEPS, batch_size=4,
            epochs=30, lr=3e-3, cache_dir=cache, progress=False,
        )
    )  # fmt: skip
    offline = tmp_path / "offline.json"
    args = ["eval-heads", "--target", target, "--heads", str(drafter), "--data", str(answers)]
    args += ["--eval-fraction", "0", "--max-seq-len", "256", "--cache-dir", cache]
    assert main([*args, "--no-progress", "--json", str(offline)]) == 0
    expected = json.loads(offline.read_text())[str(drafter)]
    chats = [
        [{"role": "user", "content": c.messages[0].content}] for c in load_conversations(answers)
    ]
    check = serve_check(target, drafter, chats, TOKENS, 8, "eagle3", STEPS)
    assert check.prompts == check.identical == 8  # float32: vanilla's tokens
    assert expected["top1"][0] > 0.5 and expected["tau"] > 1.8  # learnt by heart
    assert abs(check.acceptance[0] - expected["top1"][0]) < 0.15, (check, expected)
    assert abs(check.tau - expected["tau"]) < 0.3, (check, expected)
