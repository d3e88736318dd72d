"""Training data: formats, chat template + assistant masks, split, step plan, CLI mirror."""

from __future__ import annotations

import json
import lzma
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from tiny_targets import build_tiny_tokenizer, synthetic_conversations
from vllm_clover.assets.data import Conversation, Message
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import (
    load_conversations,
    plan_steps,
    split_train_eval,
    token_counts,
    tokenize_all,
    tokenize_conversation,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer():
    texts = [m.content for c in synthetic_conversations(16) for m in c.messages]
    return build_tiny_tokenizer(texts + ["Hi there, how are you? Fine thanks."])


def conv(*turns: tuple[str, str]) -> Conversation:
    return Conversation("c", tuple(Message(role, text) for role, text in turns))


def masked_text(tokenizer, seq) -> str:
    return tokenizer.decode(seq.input_ids[seq.loss_mask].tolist())


def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer) -> None:
    c = conv(
        ("system", "be brief"),
        ("user", "Hi there"),
        ("assistant", "Fine thanks."),
        ("user", "how are you?"),
        ("assistant", "alpha beta"),
    )
    seq = tokenize_conversation(tokenizer, c, max_len=512)
    full = tokenizer.decode(seq.input_ids.tolist())
    assert full == tokenizer.apply_chat_template(c.as_chat(), tokenize=False)
    # assistant content + end-of-turn marker, nothing of the headers or the user/system text
    assert masked_text(tokenizer, seq) == "Fine thanks.<|im_end|>alpha beta<|im_end|>"
    runs = torch.diff(seq.loss_mask.int()).ne(0).sum()
    assert int(runs) == 4  # two separate masked spans


def test_truncation_and_useless_sequences(tokenizer) -> None:
    c = conv(("user", "Hi there how are you"), ("assistant", "alpha beta gamma delta"))
    full = tokenize_conversation(tokenizer, c, max_len=512)
    cut = tokenize_conversation(tokenizer, c, max_len=len(full) - 3)
    assert len(cut) == len(full) - 3
    assert torch.equal(cut.input_ids, full.input_ids[:-3]) and cut.key != full.key
    assert torch.equal(cut.loss_mask, full.loss_mask[:-3])
    user_only_prefix = int(full.loss_mask.int().argmax())  # first assistant token
    assert tokenize_conversation(tokenizer, c, max_len=user_only_prefix) is None
    assert tokenize_conversation(tokenizer, conv(("user", "Hi")), max_len=64) is None


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def xz(path: Path, text: str) -> Path:
    path.write_bytes(lzma.compress(text.encode()))
    return path


def test_accepted_formats(tmp_path: Path) -> None:
    sharegpt = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}],
        }
    ]
    ours = {
        "id": "b",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}],
    }
    pair = {"prompt": "q", "response": "r"}
    expected = (Message("user", "q"), Message("assistant", "r"))
    files = [
        write(tmp_path / "s.json", json.dumps(sharegpt)),
        write(tmp_path / "o.jsonl", json.dumps(ours) + "\n\n"),
        write(tmp_path / "p.jsonl", json.dumps(pair) + "\n"),
        xz(tmp_path / "o.jsonl.xz", json.dumps(ours) + "\n"),
    ]
    for path in files:
        (loaded,) = load_conversations(path)
        assert loaded.messages == expected, path
    prompt_only = write(tmp_path / "q.jsonl", json.dumps({"prompt": "q"}) + "\n")
    assert load_conversations(prompt_only)[0].messages == (Message("user", "q"),)


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.jsonl", None, "data file not found"),
        ("empty.jsonl", "\n", "no records"),
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', "malformed JSON at .*bad.jsonl:2"),
        ("bad.json", "[{]", "malformed JSON in"),
        ("odd.jsonl", '{"text": "a"}\n', "unknown record format"),
        ("broken.jsonl", '{"messages": [{"role": "user"}]}\n', "malformed record"),
        ("list.jsonl", "[1, 2]\n", "expected a JSON object"),
        ("cut.jsonl.xz", "truncated", "not a complete xz file"),
    ],
)
def test_bad_data_files(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    path = tmp_path / name if text is None else write(tmp_path / name, text)
    if name.endswith(".xz"):  # a download cut short
        path.write_bytes(lzma.compress(b'{"prompt": "a"}\n' * 100)[:40])
    with pytest.raises(TrainingError, match=message):
        load_conversations(path)


def test_prompt_only_data_points_to_generate_data(tokenizer) -> None:
    with pytest.raises(TrainingError, match="generate-data"):
        tokenize_all(tokenizer, [conv(("user", "q"))], 64, "prompts.jsonl")


def test_records_without_anything_to_learn_are_reported_by_id(tokenizer, capsys) -> None:
    good = synthetic_conversations(2)
    prompt_only = Conversation("prompt-only", (Message("user", "q"),))
    long_question = Conversation(
        "long-question", (Message("user", "word " * 300), Message("assistant", "short answer"))
    )
    seqs = tokenize_all(tokenizer, [*good, prompt_only, long_question], 64, "mixed.jsonl")
    assert len(seqs) == 2
    assert capsys.readouterr().err.strip() == (
        "mixed.jsonl: dropped 2 of 4 record(s): 1 with no assistant turn (prompt-only); "
        "1 with no assistant token to learn from within --max-seq-len 64 (long-question)"
    )


def test_split_is_seeded_disjoint_and_complete(tokenizer) -> None:
    seqs = tokenize_all(tokenizer, synthetic_conversations(40), 256, "syn")
    train, held = split_train_eval(seqs, 0.1, seed=3)
    again = split_train_eval(seqs, 0.1, seed=3)
    assert [s.key for s in held] == [s.key for s in again[1]] and len(held) == 4
    assert {s.key for s in train} | {s.key for s in held} == {s.key for s in seqs}
    assert not {s.key for s in train} & {s.key for s in held}
    assert split_train_eval(seqs, 0.0, 0)[1] == []


def test_plan_steps_drop_last_and_token_budget() -> None:
    lengths = [10] * 7
    plan = plan_steps(lengths, global_batch=2, epochs=2, seed=0, max_tokens=None)
    assert len(plan) == 6 and all(len(step) == 2 for step in plan)  # 3 full batches per epoch
    assert sorted(i for step in plan[:3] for i in step) != list(range(7))  # one dropped
    budget = plan_steps(lengths, 2, epochs=5, seed=0, max_tokens=45)
    assert len(budget) == 3  # 20, 40, 60 >= 45 tokens
    assert plan_steps(lengths, 2, 2, seed=0, max_tokens=None) == plan  # deterministic
    with pytest.raises(TrainingError, match="needs 8"):
        plan_steps(lengths, 8, 1, 0, None)


def test_token_counts_only_count_assistant_tokens(tokenizer) -> None:
    seqs = tokenize_all(tokenizer, synthetic_conversations(4), 256, "syn")
    counts = token_counts(seqs, len(tokenizer))
    assert int(counts.sum()) == sum(int(s.loss_mask.sum()) for s in seqs)
    assert int(counts[tokenizer.convert_tokens_to_ids("<|im_start|>")]) == 0


def test_dropped_records_are_named_with_their_reason(capsys) -> None:
    from vllm_clover.training.data import describe_dropped

    dropped = {"no assistant turn": ["a", "b"], "x": [str(i) for i in range(7)]}
    assert describe_dropped(dropped, 20) == (
        "dropped 9 of 20 record(s): 2 with no assistant turn (a, b); "
        "7 with x (0, 1, 2, 3, 4, ... 2 more)"
    )


def test_parallel_tokenising_equals_one_process(tokenizer, monkeypatch) -> None:
    """Many conversations go to a process pool; the sequences and their order are those of
    one process (drops included)."""
    from vllm_clover.training import data

    conversations = synthetic_conversations(30) + [conv(("user", "prompt only"))]
    serial = tokenize_all(tokenizer, conversations, 96, "syn")
    monkeypatch.setattr(data, "PARALLEL_MIN_CONVERSATIONS", 8)
    monkeypatch.setattr(data, "PARALLEL_CHUNK", 4)
    monkeypatch.setattr(data.os, "cpu_count", lambda: 2)
    pools = []

    def pool(*args, **kwargs):
        pools.append(args)
        return ProcessPoolExecutor(*args, **kwargs)

    monkeypatch.setattr(data, "ProcessPoolExecutor", pool)
    many = data.tokenize_many(tokenizer, conversations, 96)
    assert pools == [(2,)]  # the pool ran it
    assert many[-1] is None and len(many) == len(conversations)
    parallel = tokenize_all(tokenizer, conversations, 96, "syn")
    assert [s.key for s in parallel] == [s.key for s in serial]
    for a, b in zip(parallel, serial, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
