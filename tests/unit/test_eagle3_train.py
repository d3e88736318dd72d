"""`vllm-clover train-eagle3` end to end on a tiny target: it learns, writes a speculators
folder, and `eval-heads` scores that folder as train-eagle3 did."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_targets import tiny_workspace, torch_threads
from vllm_clover.cli import main
from vllm_clover.eagle3.config import Eagle3TrainConfig
from vllm_clover.eagle3.train import train_eagle3
from vllm_clover.training.config import TrainingError

pytestmark = pytest.mark.unit


def test_train_eagle3_learns_and_eval_heads_reads_its_folder(tmp_path: Path, capsys) -> None:
    tiny = tiny_workspace(tmp_path, num_conversations=24)
    cfg = Eagle3TrainConfig(
        target=str(tiny["target"]),
        out=str(tmp_path / "eagle3"),
        data=str(tiny["data"]),
        cache_dir=str(tiny["cache"]),
        aux_layers=[1],
        draft_vocab_size=64,
        epochs=6,
        eval_fraction=0.2,
        batch_size=4,
        lr=3e-3,
        progress=False,
    )
    with torch_threads(1):
        result = train_eagle3(cfg)
        losses = result["losses"]
        assert sum(losses[-3:]) < sum(losses[:3])  # it learns
        assert (tmp_path / "eagle3" / "model.safetensors").is_file()
        assert "train-eagle3" in (tmp_path / "eagle3" / "README.md").read_text()
        code = main(
            [
                "eval-heads",
                "--target", str(tiny["target"]),
                "--heads", str(tmp_path / "eagle3"),
                "--data", str(tiny["data"]),
                "--eval-fraction", "0.2",
                "--cache-dir", str(tiny["cache"]),
                "--no-progress",
            ]
        )  # fmt: skip
    assert code == 0
    held = result["held_out"]
    row = [line for line in capsys.readouterr().out.splitlines() if "eagle3 |" in line][0]
    assert f"{held['top1'][0]:.3f}/{held['top5'][0]:.3f}" in row and f"{held['tau']:.3f}" in row


def test_bad_settings_are_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="--ttt-steps"):
        Eagle3TrainConfig(target="t", out=str(tmp_path / "o"), ttt_steps=0)
    (tmp_path / "taken").mkdir()
    with pytest.raises(TrainingError, match="already exists"):
        Eagle3TrainConfig(target="t", out=str(tmp_path / "taken"))
