"""The EAGLE-3 drafter's folder in the speculators format: config.json and model.safetensors,
with the weight names vLLM's ``Eagle3LlamaForCausalLM.load_weights`` reads (``layers.0.*``,
``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``). The target's input embedding is not saved:
vLLM shares the target's where a drafter has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vllm_clover.eagle3.config import Eagle3Config
from vllm_clover.eagle3.network import Eagle3Drafter
from vllm_clover.fsutil import atomic_directory

# our module name -> the speculators name (vLLM adds "model." to every one but lm_head)
NAMES = {
    "fc": "fc",
    "input_layernorm": "layers.0.input_layernorm",
    "hidden_norm": "layers.0.hidden_norm",
    "q_proj": "layers.0.self_attn.q_proj",
    "k_proj": "layers.0.self_attn.k_proj",
    "v_proj": "layers.0.self_attn.v_proj",
    "o_proj": "layers.0.self_attn.o_proj",
    "post_attention_layernorm": "layers.0.post_attention_layernorm",
    "gate_proj": "layers.0.mlp.gate_proj",
    "up_proj": "layers.0.mlp.up_proj",
    "down_proj": "layers.0.mlp.down_proj",
    "norm": "norm",
    "lm_head": "lm_head",
}


def save_eagle3(drafter: Eagle3Drafter, out: Path, verifier: str, card: str = "") -> Path:
    """Write the drafter's folder at ``out`` (atomically), for the target ``verifier``."""
    c = drafter.config
    tensors = {
        f"{NAMES[module]}.weight": getattr(drafter, module).weight.detach().float().contiguous()
        for module in NAMES
    }
    ids = drafter.draft_ids.cpu()
    tensors["d2t"] = ids - torch.arange(c.draft_vocab_size)  # target id = row + d2t[row]
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    with atomic_directory(Path(out)) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"))
        config = c.speculators_json(verifier)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if card:
            (tmp / "README.md").write_text(card)
    return Path(out)


def load_eagle3(folder: str | Path, embed: torch.Tensor) -> Eagle3Drafter:
    """A drafter saved by ``save_eagle3``, with the target's input embedding ``embed`` (V, D)."""
    folder = Path(folder)
    config = Eagle3Config.from_json(json.loads((folder / "config.json").read_text()))
    tensors = load_file(str(folder / "model.safetensors"))
    ids = torch.arange(config.draft_vocab_size) + tensors["d2t"]
    drafter = Eagle3Drafter(config, embed, ids)
    with torch.no_grad():
        for module, name in NAMES.items():
            getattr(drafter, module).weight.copy_(tensors[f"{name}.weight"])
    return drafter
