"""The EAGLE-3 folder: what is saved is what loads back, and vLLM's own config loader reads
it as the drafter it runs (Eagle3LlamaForCausalLM, with our shape and target layers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_eagle3_network import D, V, drafter

from vllm_clover.eagle3.checkpoint import load_eagle3, save_eagle3

pytestmark = pytest.mark.unit


@torch.no_grad()
def test_saved_drafter_loads_back_and_vllm_reads_its_config(tmp_path: Path) -> None:
    model = drafter()
    folder = save_eagle3(model, tmp_path / "eagle3", "some/target", card="# card\n")
    tensors = load_file(str(folder / "model.safetensors"))
    ids = model.draft_ids
    assert torch.equal(torch.arange(len(ids)) + tensors["d2t"], ids)  # row + offset = target id
    assert tensors["t2d"].sum() == len(ids) and tensors["t2d"][ids].all()
    assert "embed_tokens.weight" not in tensors  # vLLM shares the target's
    assert "layers.0.self_attn.q_proj.weight" in tensors and "fc.weight" in tensors
    back = load_eagle3(folder, model.embed)
    gen = torch.Generator().manual_seed(4)
    aux, ids_in = (
        torch.randn(1, 6, 3 * D, generator=gen),
        torch.randint(0, V, (1, 6), generator=gen),
    )
    mask = torch.ones(1, 6, dtype=torch.bool)
    for a, b in zip(
        model.unrolled(aux, ids_in, mask), back.unrolled(aux, ids_in, mask), strict=True
    ):
        torch.testing.assert_close(a, b)

    from vllm.transformers_utils.config import get_config

    config = get_config(str(folder), trust_remote_code=False)
    assert config.architectures == ["Eagle3LlamaForCausalLM"]
    assert (config.hidden_size, config.num_hidden_layers, config.draft_vocab_size) == (D, 1, 20)
    assert config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert not (config.norm_before_residual or config.norm_before_fc or config.norm_output)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
