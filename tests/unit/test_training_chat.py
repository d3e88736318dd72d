"""How a conversation reads to the target (training/chat.py): its chat template, or plain
text for a base model, in training and in self-distillation alike."""

from __future__ import annotations

import pytest

from tiny_targets import build_tiny_tokenizer, synthetic_conversations
from vllm_clover.assets.data import Conversation, Message
from vllm_clover.training.chat import has_chat_template, render_chat, special_tokens_added
from vllm_clover.training.data import tokenize_all, tokenize_conversation
from vllm_clover.training.generate_data import prompt_ids

pytestmark = pytest.mark.unit

CHAT = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]


@pytest.fixture(scope="module")
def tokenizers():
    texts = [m.content for c in synthetic_conversations(40, seed=0) for m in c.messages]
    chat = build_tiny_tokenizer(texts + ["Name a colour. Blue."])
    base = build_tiny_tokenizer(texts + ["Name a colour. Blue."])
    base.chat_template = None  # a base model's tokenizer
    return chat, base


def test_a_base_model_reads_plain_text_the_prompt_a_prefix_of_the_chat(tokenizers):
    chat, base = tokenizers
    assert has_chat_template(chat) and not has_chat_template(base)
    assert render_chat(base, CHAT[:1], add_generation_prompt=True) == "Name a colour.\n\n"
    assert render_chat(base, CHAT) == "Name a colour.\n\nBlue.\n\n"
    assert render_chat(chat, CHAT).startswith("<|im_start|>user\nName a colour.<|im_end|>")
    assert special_tokens_added(base) and not special_tokens_added(chat)


def test_the_reply_is_what_a_base_model_trains_on(tokenizers):
    """Completion mode: the loss mask covers the reply's tokens, not the prompt's; the text
    is tokenised with the tokenizer's own special tokens, as vLLM tokenises a text prompt."""
    _, base = tokenizers
    conversation = Conversation(
        "c", (Message("user", CHAT[0]["content"]), Message("assistant", "Blue."))
    )
    sequence = tokenize_conversation(base, conversation, max_len=64)
    text = base.decode(sequence.input_ids[sequence.loss_mask])
    assert text.strip() == "Blue."
    prompt = base.decode(sequence.input_ids[~sequence.loss_mask], skip_special_tokens=True)
    assert prompt.strip() == "Name a colour."
    assert sequence.input_ids.tolist() == base(render_chat(base, CHAT))["input_ids"]


def test_self_distillation_prompts_end_where_the_reply_starts(tokenizers):
    """generate-data asks the target to continue exactly the text before the reply."""
    chat, base = tokenizers
    (plain,) = prompt_ids(base, [CHAT[:1]])
    assert plain == base("Name a colour.\n\n")["input_ids"]
    (templated,) = prompt_ids(chat, [CHAT[:1]])
    assert chat.decode(templated).endswith("<|im_start|>assistant\n")


def test_training_on_a_base_model_says_so_once(tokenizers, capsys):
    _, base = tokenizers
    conversations = synthetic_conversations(6, seed=1)
    assert len(tokenize_all(base, conversations, 128, "data.jsonl")) == 6
    assert capsys.readouterr().err.count("no chat template (a base model)") == 1


def test_an_empty_reply_is_skipped_not_refused(tokenizers):
    """A base model may stop at once: its empty reply leaves nothing to train on in that turn,
    and the conversation's other replies still train (no 'cannot locate' refusal)."""
    _, base = tokenizers
    turns = ("Name a colour.", "", "Name another.", "Red.")
    messages = tuple(Message(("user", "assistant")[i % 2], t) for i, t in enumerate(turns))
    sequence = tokenize_conversation(base, Conversation("c", messages), max_len=64)
    assert base.decode(sequence.input_ids[sequence.loss_mask]).strip() == "Red."
    alone = Conversation("d", messages[:2])
    assert tokenize_conversation(base, alone, max_len=64) is None  # no reply token at all
