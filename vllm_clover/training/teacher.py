"""The frozen target ("teacher"): loading without a network, checks, and its hidden states.

The teacher signal is the target's last-layer hidden state after the final norm, ``H``
(B, T, D) - exactly what vLLM hands a proposer. The trainer never caches logits: the target's
distribution for the token after position s is ``softmax(W_lm @ H_s)``, recomputed from the
cached H. ``check_architecture`` proves on a probe input that this identity holds for the
loaded target (``logits == H @ W_lm^T``): a target with a biased, scaled or soft-capped LM
head, or whose last hidden state is not post-norm, is refused with a message naming it.
"""

from __future__ import annotations

import hashlib
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
    input_embedding: torch.Tensor | None  # (V, D) float32 or None
    fingerprint: str  # model_fingerprint of all weights

    def release(self) -> None:
        """Drop the full model (after the cache is built); keep lm_head and the tokenizer."""
        self.model = None


def resolve_target(target: str) -> tuple[str, dict[str, Any]]:
    """(path or id, from_pretrained kwargs). A folder loads as is; an id from the local HF cache.

    'smollm2-135m-instruct' means the bundled reference target (must be fetched already).
    """
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
    embed = model.get_input_embeddings()
    embedding = embed.weight.detach().float().cpu() if embed is not None else None
    return Teacher(
        target,
        path,
        model,
        tokenizer,
        model.config,
        head.float().cpu().clone(),
        embedding,
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


def model_fingerprint(model: nn.Module, samples: int = 64) -> str:
    """sha256 over every tensor's name, shape and a strided sample of its values (float32).

    Cheap on a 70B model (a few values per tensor) and sensitive to any retraining; it keys
    the hidden-state cache together with the teacher dtype.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // samples)
        sample = flat[::step][:samples].float().cpu()
        digest.update(f"{name}:{tuple(tensor.shape)}:".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:32]


@torch.no_grad()
def teacher_forward(
    teacher: Teacher, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded ids -> (H (B, T, D) post-norm, argmax of the logits (B, T) int64)."""
    if teacher.model is None:
        raise RuntimeError("teacher model already released")
    out = teacher.model(
        input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1
    )
    hidden = out.hidden_states[-1]  # (B, T, D)
    weight = teacher.model.get_output_embeddings().weight  # (V, D)
    top1 = torch.cat(
        [
            F.linear(chunk, weight).argmax(-1)  # (B, t, V) -> (B, t)
            for chunk in hidden.split(256, dim=1)
        ],
        dim=1,
    )
    return hidden, top1


def augmenting_init(teacher: Teacher, num_layers: int) -> tuple[list[dict], torch.Tensor]:
    """The target's last ``num_layers`` decoder layer states and final-norm weight."""
    from vllm_clover.modeling import select_last_layers

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
    if len(norms) != 1:
        raise TrainingError(
            f"target {teacher.name!r}: expected one final norm weight, found "
            f"{norms or 'none'}; use --no-augmenting-block"
        )
    return layers, state[norms[0]]
