"""static_decode: grouped attention, waves over a preallocated cache, against transformers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from helpers import chi_square_fit, hf_replies
from tiny_targets import (
    build_tiny_target,
    synthetic_conversations,
    tiny_workspace,
    torch_threads,
)
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import load_conversations
from vllm_clover.training.generate_data import prompt_ids
from vllm_clover.training.static_decode import (
    Sampling,
    decode_wave,
    grouped_attention,
    grouped_attention_in,
)
from vllm_clover.training.teacher import load_teacher

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def tiny_teacher(tmp_path: Path, architecture: str = "llama"):
    conversations = synthetic_conversations(10)
    target = build_tiny_target(tmp_path / architecture, conversations, architecture=architecture)
    teacher = load_teacher(str(target), torch.device("cpu"), torch.float32)
    chats = [[{"role": "user", "content": c.messages[0].content}] for c in conversations]
    return teacher, prompt_ids(teacher.tokenizer, chats)


def test_grouped_attention_equals_sdpa_over_repeated_heads() -> None:
    """9 query heads over 3 key/value heads, left padding and a causal mask: the same output
    as SDPA on key/value heads repeated 3 times (what transformers does with a mask)."""
    torch.manual_seed(0)
    B, nh, nkv, T, hs = 2, 9, 3, 5, 8
    q, k, v = torch.randn(B, nh, T, hs), torch.randn(B, nkv, T, hs), torch.randn(B, nkv, T, hs)
    pad = torch.tensor([0, 2])
    slot = torch.arange(T)
    mask = (slot[None, None, :] <= slot[None, :, None]) & (
        slot[None, None, :] >= pad[:, None, None]
    )
    mask |= torch.eye(T, dtype=torch.bool)  # padding slots attend to themselves
    mask = mask[:, None]  # (B, 1, T, T)
    out, _ = grouped_attention(None, q, k, v, mask, scaling=hs**-0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=mask
    )
    assert out.shape == (B, T, nh, hs)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["llama", "mistral", "qwen2"])
def test_static_batching_replies_as_padded_batches_do(tmp_path: Path, architecture: str) -> None:
    """Greedy: waves over a preallocated cache write the same replies as transformers'
    generate on padded batches, prompts of several lengths, in the callers' order."""
    tiny = tiny_workspace(tmp_path, num_conversations=10)
    conversations = load_conversations(tiny["data"])
    target = build_tiny_target(tmp_path / architecture, conversations, architecture=architecture)
    padded = hf_replies(target, tiny["data"], "padded", max_new_tokens=12)
    assert len({len(c.messages[0].content) for c in conversations}) > 1
    assert all(padded) and hf_replies(target, tiny["data"], "static", max_new_tokens=12) == padded


def test_rows_that_end_leave_the_wave_with_their_replies_intact(tmp_path: Path) -> None:
    """A token chosen as EOS ends rows at different steps; compacting every 2 steps, each
    reply is the EOS-free reply cut after its first EOS, and rows left the wave early."""
    teacher, ids = tiny_teacher(tmp_path)
    model = teacher.model
    free = Sampling(max_new_tokens=16, eos_ids=(-1,), pad_id=0)
    with grouped_attention_in(model):
        full = decode_wave(model, ids, free)
    counts = torch.bincount(torch.tensor([t for row in full for t in row[:8]]))
    stop = int(counts.argmax())  # a token many replies draw early
    with grouped_attention_in(model):
        cut = decode_wave(model, ids, Sampling(16, (stop,), 0, compact_every=2))
    expected = [row[: row.index(stop) + 1] if stop in row else row for row in full]
    assert cut == expected
    with grouped_attention_in(model):
        assert decode_wave(model, ids, Sampling(16, (), 0, compact_every=2)) == full  # no EOS
    ended = [len(row) for row in cut if len(row) < 16]
    assert len(ended) >= 2 and len(set(ended)) >= 2  # rows ended, at different steps


def test_sampled_first_tokens_follow_the_targets_distribution(tmp_path: Path) -> None:
    """T = 0.5: 4,000 draws of one prompt's first token fit softmax(logits / 0.5) (chi-square
    p > 1e-3); the same draws against that distribution with a fifth of its top token's mass
    (about 0.15) spread over the others do not (power control)."""
    teacher, ids = tiny_teacher(tmp_path)
    model, prompt = teacher.model, ids[0]
    with torch.no_grad():
        probs = (model(torch.tensor([prompt])).logits[0, -1] / 0.5).softmax(-1)
    sampling = Sampling(max_new_tokens=1, eos_ids=(-1,), pad_id=0, temperature=0.5)
    generator = torch.Generator().manual_seed(0)
    with grouped_attention_in(model):
        drawn = decode_wave(model, [prompt] * 4000, sampling, generator)
    first = torch.tensor([row[0] for row in drawn])
    assert chi_square_fit(first, probs)[2] > 1e-3
    wrong = probs.clone()
    wrong[probs.argmax()] *= 0.8
    assert chi_square_fit(first, wrong / wrong.sum())[2] < 1e-6


def test_other_architectures_are_refused_by_name(tmp_path: Path) -> None:
    teacher, _ = tiny_teacher(tmp_path, "phi3")
    with pytest.raises(TrainingError, match="'phi3'.*--hf-batching padded"):
        with grouped_attention_in(teacher.model):
            pass
