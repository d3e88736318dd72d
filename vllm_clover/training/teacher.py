"""The frozen target ("teacher"): loading without a network, checks, and its hidden states.

The teacher signal is H, the target's post-norm last hidden state (what vLLM hands a
proposer); logits are never cached. ``check_architecture`` proves on a probe input that
logits == H @ W_lm^T. How it works: docs/design/training-internals.md, "The teacher".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.training.config import TrainingError


@dataclass
class Teacher:
    """A loaded target and the tensors the Clover heads need from it."""

    name: str  # as given on the command line
    path: str  # folder or Hugging Face id actually loaded
    model: nn.Module | None  # the HF causal LM (None once released)
    tokenizer: Any
    config: Any  # the HF PretrainedConfig
    lm_head: torch.Tensor  # (V, D) float32, on CPU, detached copy
    fingerprint: str  # model_fingerprint of all weights

    def release(self) -> None:
        """Drop the full model (after the cache is built); keep lm_head and the tokenizer."""
        self.model = None


def resolve_target(target: str) -> tuple[str, dict[str, Any]]:
    """(path or id, from_pretrained kwargs): a folder as is, an id from the local HF cache,
    'smollm2-135m-instruct' the bundled reference target (fetched already)."""
    from vllm_clover.assets.target import MARKER, REFERENCE_TARGET, reference_target_dir

    if target == REFERENCE_TARGET:
        folder = reference_target_dir()
        if not (folder / MARKER).is_file():
            raise TrainingError(
                f"reference target not cached at {folder}; run "
                f"`vllm-clover fetch {REFERENCE_TARGET}` first"
            )
        return str(folder), {}
    if Path(target).expanduser().is_dir():
        return str(Path(target).expanduser()), {}
    if Path(target).expanduser().exists() or target.startswith((".", "/", "~")):
        raise TrainingError(f"target folder not found: {target}")
    return target, {"local_files_only": True}


def load_teacher(target: str, device: torch.device, dtype: torch.dtype) -> Teacher:
    """Load tokenizer + causal LM (frozen, eval mode) and check that it fits Clover."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, kwargs = resolve_target(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        hint = (
            " (no network is used: pass a folder or pre-download the model into the "
            "Hugging Face cache)"
            if kwargs
            else ""
        )
        raise TrainingError(f"cannot load target {target!r} as a causal LM: {err}{hint}") from err
    model.to(device).eval().requires_grad_(False)
    check_architecture(model, target)
    head = model.get_output_embeddings().weight.detach()
    return Teacher(
        target,
        path,
        model,
        tokenizer,
        model.config,
        head.float().cpu().clone(),
        model_fingerprint(model),
    )


def check_architecture(model: nn.Module, target: str) -> None:
    """TrainingError unless logits == last post-norm hidden state @ W_lm^T (plain linear head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        raise TrainingError(
            f"target {target!r} ({type(model).__name__}) has no linear LM head "
            "(get_output_embeddings); Clover needs one"
        )
    if head.bias is not None:
        raise TrainingError(
            f"target {target!r}: its LM head has a bias; Clover heads score "
            "with the bias-free LM-head weight, as vLLM's drafters do"
        )
    transformed = logit_transform(model.config)
    if transformed:
        raise TrainingError(
            f"target {target!r} ({type(model).__name__}): {transformed}, so its distribution is "
            "not the plain LM head of its hidden state that the heads score"
        )
    ids = torch.arange(1, 9, device=head.weight.device).unsqueeze(0) % head.weight.shape[0]
    out = model(ids, output_hidden_states=True)
    if getattr(out, "hidden_states", None) is None:
        raise TrainingError(f"target {target!r} does not return hidden states")
    hidden = out.hidden_states[-1]  # (1, 8, D)
    expected = F.linear(hidden.float(), head.weight.float())  # (1, 8, V)
    tol = 1e-3 if hidden.dtype == torch.float32 else 5e-2
    if not torch.allclose(out.logits.float(), expected, rtol=tol, atol=tol * 10):
        raise TrainingError(
            f"target {target!r} ({type(model).__name__}): logits != LM head(last hidden state); "
            "its last hidden state is not post-norm or its logits are scaled/soft-capped, so the "
            "heads could not be trained on what vLLM hands a proposer"
        )


# Config fields by which Hugging Face models transform their logits after the LM head.
SOFT_CAP_FIELDS = ("final_logit_softcapping",)  # Gemma 2
SCALE_FIELDS = ("logit_scale", "logits_scaling")  # Cohere, Granite


def logit_transform(config: Any) -> str:
    """ "" if the config's logits are the plain LM-head product, else what it does to them
    (a small probe input can miss a soft cap, whose effect shows only on large logits)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in SOFT_CAP_FIELDS:
        if getattr(text, field, None):
            return f"its logits are soft-capped ({field}={getattr(text, field)})"
    for field in SCALE_FIELDS:
        if getattr(text, field, None) not in (None, 1, 1.0):
            return f"its logits are scaled ({field}={getattr(text, field)})"
    return ""


def model_fingerprint(model: nn.Module, samples: int = 64) -> str:
    """sha256 over every tensor's name, shape and a strided sample of its values (float32):
    cheap on any model, changed by any retraining; part of the hidden-state cache's key."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // samples)
        sample = flat[::step][:samples].float().cpu()
        digest.update(f"{name}:{tuple(tensor.shape)}:".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:32]


# Logits materialised at once by `argmax_rows`, whatever the vocabulary and batch (256 MB in fp32)
ARGMAX_CHUNK_ELEMENTS = 1 << 26


@torch.no_grad()
def teacher_forward(
    teacher: Teacher,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor | None = None,
    compiled: nn.Module | None = None,
    layers: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded ids -> (H (B, T, D) post-norm, argmax of the logits (B, T) int64).

    With ``layers`` (A target layers) the first is [H | L_j ...] (B, T, (1 + A) * D), L_j the
    input of decoder layer j; the argmax is always H's, over the LM-head ``rows`` (N,) only
    when given (as target ids). ``compiled``: ``torch.compile(teacher.model)``, run instead.
    """
    if teacher.model is None:
        raise RuntimeError("teacher model already released")
    out = (teacher.model if compiled is None else compiled)(
        input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1
    )
    hidden = out.hidden_states[-1]  # (B, T, D)
    weight = teacher.model.get_output_embeddings().weight  # (V, D)
    if rows is None:
        top1 = argmax_rows(hidden, weight)
    else:
        rows = rows.to(weight.device)
        top1 = rows[argmax_rows(hidden, weight[rows])]
    if layers:
        hidden = torch.cat([hidden, *(out.hidden_states[j] for j in layers)], dim=-1)
    return hidden, top1  # (B, T, (1 + A) * D), (B, T)


def argmax_rows(
    hidden: torch.Tensor, weight: torch.Tensor, max_elements: int = ARGMAX_CHUNK_ELEMENTS
) -> torch.Tensor:
    """argmax_v (H @ W^T)[..., v] for H (..., D), W (V, D) -> (...,) int64, computing at most
    ``max_elements`` logits at a time (max_elements // V positions a chunk)."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    rows = max(1, max_elements // weight.shape[0])
    top1 = [F.linear(chunk, weight).argmax(-1) for chunk in flat.split(rows)]
    return torch.cat(top1).view(hidden.shape[:-1])


def augmenting_init(teacher: Teacher, num_layers: int) -> tuple[list[dict], torch.Tensor]:
    """The target's last ``num_layers`` decoder layer states and final-norm weight; a
    TrainingError naming what does not fit (``target_layers.mirror_problems``) when the
    Augmenting Block cannot start as a copy of them, suggesting --no-augmenting-block."""
    from vllm_clover.modeling.target_layers import (
        mirror_problems,
        parameter_names,
        select_last_layers,
    )

    if teacher.model is None:
        raise RuntimeError("teacher model already released")
    state = teacher.model.state_dict()
    norms = [k for k in state if k.endswith("norm.weight") and ".layers." not in k]
    try:
        layers = select_last_layers(state, num_layers)
    except ValueError as err:
        raise TrainingError(
            f"target {teacher.name!r}: cannot initialise the Augmenting Block ({err})"
        ) from err
    text = (
        teacher.config.get_text_config()
        if hasattr(teacher.config, "get_text_config")
        else (teacher.config)
    )
    problems = mirror_problems(text, set.union(*(parameter_names(layer) for layer in layers)))
    if len(norms) != 1:
        problems.append(f"expected one final norm weight, found {norms or 'none'}")
    if problems:
        raise TrainingError(
            f"target {teacher.name!r} ({type(teacher.model).__name__}): the Augmenting Block "
            f"cannot start as a copy of its last layer: {'; '.join(problems)}. Train the heads "
            "without it: --no-augmenting-block"
        )
    return layers, state[norms[0]]


@torch.no_grad()
def check_block_mirrors(teacher: Teacher, block: nn.Module) -> None:
    """TrainingError unless the freshly copied block computes what the target's last layers
    compute: block(input of the last L layers) == the target's final hidden state H, on a
    probe input. Catches any difference the structural check could not name."""
    if teacher.model is None:
        raise RuntimeError("teacher model already released")
    weight = teacher.model.get_output_embeddings().weight
    ids = torch.arange(1, 17, device=weight.device).unsqueeze(0) % weight.shape[0]  # (1, 16)
    hidden = teacher.model(ids, output_hidden_states=True).hidden_states
    num_layers = len(block.layers)
    first = next(block.parameters())
    got = block(hidden[-1 - num_layers].to(first.dtype), torch.arange(16, device=ids.device))
    expected = hidden[-1].to(got.dtype)
    if hidden[-1].dtype == torch.float32:
        same = torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
    else:  # a bf16 target rounds its residual stream at every layer: 1.7% over 2 layers
        same = float((got - expected).norm() / expected.norm()) < 5e-2
    if not same:
        gap = float((got - expected).abs().max())
        raise TrainingError(
            f"target {teacher.name!r} ({type(teacher.model).__name__}): the Augmenting Block, "
            f"copied from its last layer, does not reproduce it (max |difference| {gap:.3g} on "
            "a probe input). Train the heads without it: --no-augmenting-block"
        )
