"""`vllm-clover make-heads` (make_heads.py): one command from a target to heads checked
through vLLM, on tiny random targets: an instruct one with a chat template, and a base one
without (plain-text completion). A second run reuses every step."""

from __future__ import annotations

import json

import pytest

from tiny_targets import build_tiny_target, synthetic_conversations, torch_threads, write_jsonl
from vllm_clover.cli import main

pytestmark = pytest.mark.engine


def _target(root, chat_template: bool):
    conversations = synthetic_conversations(40, seed=2)
    target = build_tiny_target(root / "target", conversations, hidden_size=128)
    if not chat_template:  # a base model: its tokenizer has none
        config = target / "tokenizer_config.json"
        fields = json.loads(config.read_text())
        fields.pop("chat_template", None)
        config.write_text(json.dumps(fields))
        (target / "chat_template.jinja").unlink(missing_ok=True)
    return target, write_jsonl(root / "prompts.jsonl", conversations)


@pytest.mark.parametrize("chat_template", [True, False], ids=["instruct", "base"])
def test_one_command_from_a_target_to_checked_heads(tmp_path, capsys, chat_template):
    target, prompts = _target(tmp_path, chat_template)
    out = tmp_path / "work"
    args = ["make-heads", "--target", str(target), "--out", str(out), "--prompts", str(prompts)]
    args += ["--samples", "32", "--max-new-tokens", "32", "--num-heads", "2", "--epochs", "6"]
    args += ["--draft-vocab-size", "128", "--check-prompts", "4", "--check-tokens", "24"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--dtype", "float32"]
    with torch_threads(1):
        assert main(args) == 0
    captured = capsys.readouterr()
    assert ("no chat template (a base model)" in captured.err) != chat_template
    check = json.loads((out / "check.json").read_text())
    assert check["prompts"] == 4 and check["identical"] == 4  # float32: vanilla's tokens
    assert check["tau"] is not None and check["tau"] > 1, check  # drafted and accepted
    assert "| greedy outputs equal to vanilla | 4/4 |" in captured.out
    card = (out / "heads" / "README.md").read_text()
    assert "## Checked by `vllm-clover make-heads`" in card and "4/4" in card
    assert "held-out answers: top-1 per head" in captured.out  # train's own last lines
    with torch_threads(1):
        assert main(args) == 0  # again: every step's output is reused
    again = capsys.readouterr().out
    assert f"reusing {out / 'data.jsonl'}" in again and f"reusing {out / 'heads'}" in again
