"""How a conversation reads to the target: its chat template, or plain text for a base model.

An instruct model renders a chat with its chat template. A base model has none: it continues
text. Without a template (completion mode) a chat is its turns' contents, each followed by a
blank line, so that the prompt of turn j is the text before it and the target's reply is
the continuation of that text, as `LLM.generate` would continue it::

    "Name a colour.\n\n"             the prompt (what the target continues)
    "Name a colour.\n\nBlue.\n\n"    the chat with the reply (trained on "Blue.")

Text from a template already holds the template's own special tokens, so it is tokenised
without more; plain text gets the tokenizer's own (a BOS where the model wants one), as
vLLM tokenises a text prompt.
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
    """The chat as one text: the chat template's rendering, or plain text (see above).

    Example without a template: [{"role": "user", "content": "Hi"}] -> "Hi\\n\\n", with or
    without the generation prompt (in plain text the prompt is the text so far).
    """
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    return "".join(m["content"] + SEPARATOR for m in messages)


def special_tokens_added(tokenizer: Any) -> bool:
    """Whether text from ``render_chat`` is tokenised with the tokenizer's special tokens
    (plain text) or as it is (a template's rendering holds its own)."""
    return not has_chat_template(tokenizer)
