"""`vllm-clover bench`: prompt files, the default MT-Bench prompts, cycling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_clover.bench.config import BenchError
from vllm_clover.bench.prompts import load_prompts, take_prompts

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ prompts
def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_prompts_from_jsonl_and_sharegpt(tmp_path):
    plain = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}, {"prompt": "Why?"}])
    assert load_prompts(plain) == [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Why?"}],
    ]
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "system", "value": "Be brief."},
                        {"from": "human", "value": "Q1"},
                        {"from": "gpt", "value": "A1"},
                        {"from": "human", "value": "Q2"},
                        {"from": "gpt", "value": "A2"},
                    ],
                },
                {
                    "id": "b",
                    "conversations": [
                        {"from": "human", "value": "Q1"},
                        {"from": "gpt", "value": "A1"},
                        {"from": "human", "value": "Q2"},
                    ],
                },
            ]
        )
    )
    assert load_prompts(sharegpt) == [  # answered: its first turn; open: its last turn
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}],
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2"},
        ],
    ]


def test_default_prompts_are_mtbench_first_turns(mtbench_path):
    chats = load_prompts(None)
    assert len(chats) == 80 and all(len(c) == 1 and c[0]["role"] == "user" for c in chats)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty file"),
        (
            '{"messages": [{"role": "assistant", "content": "x"}]}\n',
            "no record in .* has a user turn",
        ),
        ("not json\n", "malformed JSON"),
    ],
)
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(BenchError, match=message):
        load_prompts(path)
    with pytest.raises(BenchError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_take_prompts_cycles_when_short():
    assert take_prompts([["a"], ["b"]], 5) == [["a"], ["b"], ["a"], ["b"], ["a"]]
    assert take_prompts([["a"], ["b"], ["c"]], 2) == [["a"], ["b"]]
