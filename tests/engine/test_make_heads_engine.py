"""`vllm-clover make-heads` (make_heads.py): one command from a target (the reference one) to
heads checked through vLLM: self-distillation, training, held-out figures, and the check on
prompts the heads never saw (float32: vanilla's tokens; drafts accepted). A second run reuses
every step. Each run is a child process, as a user's command is: its engines leave this
process's vLLM state alone. (Completion mode, for a base model, is tested step by step in
tests/unit/test_training_chat.py.)"""

from __future__ import annotations

import json

import pytest

from helpers import run_python
from tiny_targets import synthetic_conversations, write_jsonl

pytestmark = pytest.mark.engine


def _make_heads(args: list[str]) -> str:
    """`vllm-clover make-heads ARGS` in a child process; its output."""
    code = f"from vllm_clover.cli import main; import sys; sys.exit(main({args!r}))"
    return run_python(f"if __name__ == '__main__':\n    {code}", timeout=1200)


def test_one_command_from_a_target_to_checked_heads(reference_target, tmp_path):
    out = tmp_path / "work"
    # short one-turn prompts ("repeat: ..."), so that the teacher and training run in seconds
    prompts = write_jsonl(tmp_path / "prompts.jsonl", synthetic_conversations(40, seed=2))
    args = ["make-heads", "--target", str(reference_target), "--out", str(out)]
    args += ["--prompts", str(prompts), "--dtype", "float32"]
    args += ["--samples", "32", "--max-new-tokens", "32", "--num-heads", "2", "--epochs", "4"]
    args += ["--lr", "3e-3", "--draft-vocab-size", "2048", "--check-prompts", "4"]
    args += ["--check-tokens", "48", "--cache-dir", str(tmp_path / "cache")]
    output = _make_heads(args)
    check = json.loads((out / "check.json").read_text())
    assert check["prompts"] == 4 and check["identical"] == 4  # float32: vanilla's tokens
    assert check["tau"] is not None and check["tau"] > 1, check  # drafted and accepted
    assert "| greedy outputs equal to vanilla | 4/4 |" in output
    card = (out / "heads" / "README.md").read_text()
    assert "## Checked by `vllm-clover make-heads`" in card and "4/4" in card
    assert "held-out answers: top-1 per head" in output  # train's own last lines
    again = _make_heads(args)  # again: every step's output is reused
    assert f"reusing {out / 'data.jsonl'}" in again and f"reusing {out / 'heads'}" in again
    assert (out / "heads" / "README.md").read_text() == card  # its section replaced, not added
