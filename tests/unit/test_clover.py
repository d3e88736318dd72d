"""CloverModel: the three parts composed, every ablation, and the checkpoint's flat names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import D, K, V, random_clover, tiny_config
from vllm_clover.modeling import CloverConfig, CloverModel, shift_tokens_for_heads
from vllm_clover.modeling.clover import split_checkpoint_state

pytestmark = pytest.mark.unit

VARIANTS = {
    "clover": {},
    "no_decoder": dict(use_attention_decoder=False),
    "no_regressive": dict(use_regressive_connection=False),
    "no_augmenting": dict(use_augmenting_block=False),
    "two_layers_draft_vocab": dict(num_augmenting_layers=2, draft_vocab_size=40),
    "medusa": dict(
        use_augmenting_block=False, use_attention_decoder=False, use_regressive_connection=False
    ),
    "clover2_draft_vocab": dict(
        fuse_next_token=True,
        head_projection="linear",
        num_augmenting_layers=2,
        draft_vocab_size=40,
    ),
    "gated": dict(augmenting_gate=True),
    "linear_heads_no_block": dict(head_projection="linear", use_augmenting_block=False),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_and_propose_shapes(variant: str) -> None:
    cfg = tiny_config(**VARIANTS[variant])
    model, _ = random_clover(cfg)
    tokens = shift_tokens_for_heads(torch.randint(0, V, (2, 9)), K)
    logits = model(torch.randn(2, 9, D), tokens.input_ids)
    assert logits.shape == (2, 9, K, cfg.draft_vocab_size or V)
    drafts = model.propose(torch.randn(5, D), torch.randint(0, V, (5,)), num_steps=2)
    assert drafts.shape == (5, 2) and drafts.dtype == torch.int64
    assert int(drafts.min()) >= 0 and int(drafts.max()) < V


@pytest.mark.parametrize(
    "flags",
    [
        dict(use_attention_decoder=True, use_regressive_connection=True),
        dict(use_attention_decoder=False, use_regressive_connection=True),
        dict(use_attention_decoder=True, use_regressive_connection=False),
    ],
)
def test_fresh_clover_equals_medusa(flags: dict) -> None:
    """At init the decoder / W_R are exactly the identity: same logits as Medusa heads."""
    medusa, lm_head = random_clover(tiny_config(**VARIANTS["medusa"]))  # random ResBlocks
    torch.manual_seed(123)
    clover = CloverModel(tiny_config(use_augmenting_block=False, **flags))  # fresh init
    clover.heads.blocks.load_state_dict(medusa.heads.blocks.state_dict())
    clover.attach_target(lm_head)
    hidden, ids = torch.randn(2, 6, D), torch.randint(0, V, (2, 6))
    head_inputs = shift_tokens_for_heads(ids, K).input_ids
    assert torch.equal(clover(hidden, head_inputs), medusa(hidden, head_inputs))
    h0, t0 = torch.randn(4, D), torch.randint(0, V, (4,))
    assert torch.equal(clover.propose(h0, t0, K), medusa.propose(h0, t0, K))


def expected_param_count(cfg: CloverConfig) -> int:
    """Parameter count by formula (independent of the module code)."""
    d, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    attn = d * cfg.num_attention_heads * hd * 2 + d * cfg.num_key_value_heads * hd * 2
    layer = attn + 3 * d * i + 2 * d
    per_head = 2 * d * d + d if cfg.head_projection == "linear" else d * d + d
    total = cfg.num_heads * per_head  # ResBlocks or projections of [h ; e], with bias
    if cfg.use_augmenting_block:
        total += cfg.num_augmenting_layers * layer + d
    total += (3 * d * d + d) * cfg.fuse_next_token + d * cfg.augmenting_gate
    if cfg.use_attention_decoder:
        total += 3 * d * d + d
        if not cfg.use_regressive_connection:
            total += cfg.num_heads * d  # learned per-step embedding
    elif cfg.use_regressive_connection:
        total += d * d  # W_R
    return total


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parameter_counts_scale_linearly(variant: str) -> None:
    counts = {}
    for heads in (1, 2, 4):
        for layers in (1, 2, 3):
            cfg = tiny_config(
                **{**VARIANTS[variant], "num_heads": heads, "num_augmenting_layers": layers}
            )
            with torch.device("meta"):
                model = CloverModel(cfg)
            counts[heads, layers] = sum(p.numel() for p in model.parameters())
            assert counts[heads, layers] == expected_param_count(cfg)
    per_head = counts[2, 1] - counts[1, 1]
    assert counts[4, 1] - counts[2, 1] == 2 * per_head
    per_layer = counts[1, 2] - counts[1, 1]
    assert counts[1, 3] - counts[1, 2] == per_layer


@pytest.mark.parametrize(
    "variant",
    [
        "clover",
        "no_decoder",
        "no_regressive",
        "two_layers_draft_vocab",
        "clover2_draft_vocab",
        "gated",
        "linear_heads_no_block",
    ],
)
def test_teacher_forced_forward_equals_propose(variant: str) -> None:
    model, _ = random_clover(tiny_config(**VARIANTS[variant]))
    hidden, t, t0 = torch.randn(1, 8, D), 5, torch.tensor([17])
    next_ids = torch.zeros(1, 8, dtype=torch.long)
    next_ids[0, t] = t0  # what the block's fusion reads at t (Clover-2)
    with torch.no_grad():
        h0 = model.augment(hidden, next_ids)[:, t]  # (1, D)
    drafts = model.propose(h0, t0, K)  # (1, K) target ids
    head_inputs = torch.zeros(1, 8, K, dtype=torch.long)
    head_inputs[0, t] = torch.cat([t0, drafts[0, :-1]])  # [t0, own argmax 0, own argmax 1]
    with torch.no_grad():
        logits = model(hidden, head_inputs)  # (1, 8, K, N)
    assert torch.equal(model.tables.draft_to_target(logits[0, t].argmax(-1)), drafts[0])


def test_augment_is_the_identity_without_the_block() -> None:
    model, _ = random_clover(tiny_config(use_augmenting_block=False))
    hidden = torch.randn(2, 4, D)
    next_ids = torch.randint(0, V, (2, 4))
    assert model.augmenting is None and torch.equal(model.augment(hidden, next_ids), hidden)


def test_fresh_gate_makes_the_block_the_identity() -> None:
    """A zero gate: h0 = H whatever the block computes; the block still gets a gradient
    through the gate's own one once the gate moves."""
    model, _ = random_clover(tiny_config(augmenting_gate=True))
    with torch.no_grad():
        model.adapter.gate.zero_()
    hidden, next_ids = torch.randn(2, 5, D), torch.randint(0, V, (2, 5))
    assert torch.equal(model.augment(hidden, next_ids), hidden)
    model.augment(hidden, next_ids).sum().backward()
    assert model.adapter.gate.grad.abs().sum() > 0


def test_fusion_reads_the_next_token() -> None:
    """With fuse_next_token, h0 at t depends on x_{t+1}; without, it does not."""
    for fuse, differs in ((True, True), (False, False)):
        model, _ = random_clover(tiny_config(fuse_next_token=fuse))
        hidden, ids = torch.randn(1, 5, D), torch.randint(0, V, (1, 5))
        other = ids.clone()
        other[0, 4] = (ids[0, 4] + 1) % V
        with torch.no_grad():
            a, b = model.augment(hidden, ids), model.augment(hidden, other)
        assert torch.equal(a[:, :4], b[:, :4])  # causal: earlier positions never see it
        assert (not torch.equal(a[:, 4], b[:, 4])) == differs


def test_checkpoint_names_are_flat_and_route_back_to_their_parts() -> None:
    model, _ = random_clover(tiny_config(num_augmenting_layers=2, draft_vocab_size=40))
    state = model.checkpoint_state()
    assert {
        "layers.1.mlp.up_proj.weight",
        "norm.weight",
        "draft_vocab_ids",
        "decoder.q_proj.weight",
        "blocks.2.layers.0.bias",
    } <= set(state)
    assert not any(n.startswith(("heads.", "tables.", "augmenting.")) for n in state)
    parts = split_checkpoint_state(state)
    assert set(parts.tables) == {"draft_vocab_ids"}
    assert set(parts.augmenting) == set(model.augmenting.state_dict())
    assert set(parts.heads) == set(model.heads.state_dict())
    assert parts.adapter == {}
    again = CloverModel(model.config)
    again.load_checkpoint_state(state)
    assert all(torch.equal(state[n], t) for n, t in again.checkpoint_state().items())
    with pytest.raises(ValueError, match="unexpected Augmenting Block weights"):
        CloverModel(tiny_config(use_augmenting_block=False)).load_checkpoint_state(state)


def test_modeling_does_not_import_vllm() -> None:
    code = (
        "import sys, vllm_clover.modeling; "
        "sys.exit(any(m.split('.')[0] == 'vllm' for m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_adapter_weights_route_to_the_adapter() -> None:
    cfg = tiny_config(fuse_next_token=True, augmenting_gate=True, head_projection="linear")
    model, _ = random_clover(cfg)
    state = model.checkpoint_state()
    parts = split_checkpoint_state(state)
    assert set(parts.adapter) == {
        "fuse.norm.weight",
        "fuse.q_proj.weight",
        "fuse.k_proj.weight",
        "fuse.v_proj.weight",
        "gate",
    }
    assert {"blocks.0.weight", "blocks.0.bias"} <= set(parts.heads)
    again = CloverModel(cfg)
    again.load_checkpoint_state(state)
    assert all(torch.equal(state[n], t) for n, t in again.checkpoint_state().items())
    with pytest.raises(RuntimeError, match="Missing key"):
        CloverModel(cfg).load_checkpoint_state({k: v for k, v in state.items() if k != "gate"})
