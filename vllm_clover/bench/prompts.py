"""Benchmark prompts: chats the same for every method (a first turn, or a later one)."""

from __future__ import annotations

from pathlib import Path

from vllm_clover.assets.data import Conversation
from vllm_clover.bench.config import BenchError

Chat = list[dict[str, str]]


def prompt_chat(conversation: Conversation) -> Chat | None:
    """A conversation that ends with a user turn, whole (a later turn, earlier answers in
    its context: a multi-turn workload); any other, up to and including its first user turn;
    None without a user turn. Example: [u1, a1, u2] -> itself; [u1, a1, u2, a2] -> [u1]."""
    chat = conversation.as_chat()
    if chat and chat[-1]["role"] == "user":
        return chat
    first = next((i for i, m in enumerate(chat) if m["role"] == "user"), None)
    return None if first is None else chat[: first + 1]


def load_prompts(path: str | Path | None = None, cache_dir: str | None = None) -> list[Chat]:
    """Prompts as chats: MT-Bench first turns, or the first user turn of each record of a
    JSONL/JSON file in any format `vllm-clover train --data` reads ({"prompt": ...},
    ShareGPT {"conversations": ...}, {"messages": ...})."""
    if path is None:
        from vllm_clover.assets.data import fetch_mtbench, mtbench_questions

        return [
            [{"role": "user", "content": q.turns[0]}]
            for q in mtbench_questions(fetch_mtbench(cache_dir))
        ]
    from vllm_clover.training.config import TrainingError
    from vllm_clover.training.data import load_conversations

    try:
        conversations = load_conversations(path)
    except TrainingError as err:
        raise BenchError(f"--prompts: {err}") from err
    chats = [chat for chat in map(prompt_chat, conversations) if chat is not None]
    if not chats:
        raise BenchError(f"--prompts: no record in {path} has a user turn")
    return chats


def take_prompts(chats: list[Chat], count: int) -> list[Chat]:
    """The first `count` prompts, cycling through `chats` again if there are fewer."""
    if not chats:
        raise BenchError("no prompts")
    return [chats[i % len(chats)] for i in range(count)]
