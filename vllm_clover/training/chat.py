"""How a conversation reads to the target: its chat template, or plain text for a base model.

Without a template (completion mode) a chat is its turns' contents, each followed by a blank
line, and the target's reply is its continuation of the text before it, as `LLM.generate`
would write it. Examples: docs/design/training-internals.md, "Chat rendering".
"""

from __future__ import annotations

from typing import Any

SEPARATOR = "\n\n"  # after each turn's content in completion mode
COMPLETION_NOTE = (
    "the target's tokenizer has no chat template (a base model): prompts and replies are "
    "plain text, each reply the target's continuation of its prompt (completion mode)"
)


def has_chat_template(tokenizer: Any) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def render_chat(
    tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = False
) -> str:
    """The chat as one text: the chat template's rendering, or plain text (see above; the
    generation prompt adds nothing to plain text)."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    return "".join(m["content"] + SEPARATOR for m in messages)


def special_tokens_added(tokenizer: Any) -> bool:
    """Whether text from ``render_chat`` is tokenised with the tokenizer's special tokens
    (plain text) or as it is (a template's rendering holds its own)."""
    return not has_chat_template(tokenizer)
