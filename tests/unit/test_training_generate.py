"""generate-data: turn-by-turn regeneration (fake engine) and the transformers engine end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny_targets import tiny_workspace, torch_threads
from vllm_clover.assets.data import Conversation, Message
from vllm_clover.cli import main
from vllm_clover.training.data import load_conversations
from vllm_clover.training.generate_data import length_batches, regenerate

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def conv(cid: str, *turns: tuple[str, str]) -> Conversation:
    return Conversation(cid, tuple(Message(role, text) for role, text in turns))


def test_regenerate_round_by_round() -> None:
    calls: list[list[list[dict]]] = []

    def fake(chats):
        calls.append(chats)
        # reply names the round and the last user turn; refuse prompts mentioning "huge"
        return [
            None if "huge" in c[-1]["content"] else f"r{len(calls)}:{c[-1]['content']}"
            for c in chats
        ]

    data = [
        conv(
            "two",
            ("system", "s"),
            ("user", "a"),
            ("assistant", "old"),
            ("user", "b"),
            ("assistant", "old"),
        ),
        conv("prompt", ("user", "p")),
        conv("lead", ("assistant", "hello"), ("user", "c"), ("assistant", "old")),
        conv("cut", ("user", "d"), ("assistant", "old"), ("user", "huge"), ("assistant", "old")),
        conv("gone", ("user", "huge"), ("assistant", "old")),
        conv("silent", ("assistant", "a reply to nothing")),
    ]
    regenerated, dropped = regenerate(data, fake)
    out = {c.id: c for c in regenerated}
    assert len(calls) == 2 and len(calls[0]) == 5 and len(calls[1]) == 2  # batched per round
    # round 2 sees round 1's regenerated reply, not the original
    assert calls[1][0][2] == {"role": "assistant", "content": "r1:a"}
    assert [m.content for m in out["two"].messages] == ["s", "a", "r1:a", "b", "r2:b"]
    assert out["prompt"].messages == (Message("user", "p"), Message("assistant", "r1:p"))
    assert out["lead"].messages[0] == Message("user", "c")  # a reply to nothing is dropped
    assert [m.content for m in out["cut"].messages] == ["d", "r1:d"]  # ends before "huge"
    assert "gone" not in out and "silent" not in out
    assert dropped == {
        "a first prompt too long for the context": ["gone"],
        "no user turn": ["silent"],
    }
    limited = regenerate(data[:1], fake, max_turns=1)[0][0]
    assert [m.content for m in limited.messages] == ["s", "a", "r3:a"]


def test_length_batches_group_similar_prompts() -> None:
    assert length_batches([9, 3, 7, 4], 2) == [[1, 3], [2, 0]]
    assert length_batches([5, 5, 1], 2) == [[2, 0], [1]]  # ties keep their order
    assert length_batches([], 4) == []


def test_hf_engine_end_to_end_then_train(tmp_path: Path, capsys) -> None:
    tiny = tiny_workspace(tmp_path, num_conversations=12)
    prompts = tmp_path / "prompts.jsonl"
    records = [{"prompt": c.messages[0].content} for c in load_conversations(tiny["data"])]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "self.jsonl"
    code = main(
        [
            "generate-data",
            "--engine",
            "hf",
            "--target",
            str(tiny["target"]),
            "--data",
            str(prompts),
            "--out",
            str(out),
            "--max-new-tokens",
            "12",
            "--batch-size",
            "8",
            "--device",
            "cpu",
        ]
    )
    assert code == 0 and "wrote 12 conversation(s)" in capsys.readouterr().out
    regenerated = load_conversations(out)
    assert [m.role for m in regenerated[0].messages] == ["user", "assistant"]
    code = main(
        [
            "train",
            "--target",
            str(tiny["target"]),
            "--data",
            str(out),
            "--out",
            str(tmp_path / "heads"),
            "--cache-dir",
            str(tiny["cache"]),
            "--epochs",
            "2",
            "--eval-fraction",
            "0.25",
            "--batch-size",
            "3",
            "--no-progress",
        ]
    )
    assert code == 0 and (tmp_path / "heads" / "model.safetensors").is_file()


def test_hf_engine_on_a_base_model_completes_the_plain_prompt(tmp_path: Path, capsys) -> None:
    """A tokenizer without a chat template (a base model): generate-data says it works in
    completion mode, once, and each reply is the model's own greedy continuation of the
    prompt as plain text followed by a blank line (what LLM.generate would be given)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = tiny_workspace(tmp_path, num_conversations=4)
    target = tiny["target"]
    tokenizer = AutoTokenizer.from_pretrained(target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    assert AutoTokenizer.from_pretrained(target).chat_template is None
    out = tmp_path / "self.jsonl"
    args = ["generate-data", "--engine", "hf", "--target", str(target), "--data"]
    args += [str(tiny["data"]), "--out", str(out), "--max-new-tokens", "8", "--device", "cpu"]
    assert main(args) == 0
    assert capsys.readouterr().err.count("no chat template (a base model)") == 1
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    conversations = load_conversations(out)
    assert len(conversations) == 4 and all(c.messages[1].content for c in conversations)
    for conversation in conversations:
        prompt, reply = (m.content for m in conversation.messages)
        ids = tokenizer(prompt + "\n\n", return_tensors="pt")["input_ids"]
        greedy = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
        expected = tokenizer.decode(greedy, skip_special_tokens=True)
        assert reply == expected.strip() or reply == expected, (reply, expected)
