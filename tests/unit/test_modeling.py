"""Unit tests for the pure-PyTorch Clover network (tiny CPU models)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vllm_clover.modeling import (
    CloverConfig,
    CloverHeads,
    draft_vocab_from_counts,
    init_augmenting_from_target,
    select_last_layers,
    shift_tokens_for_heads,
)
from vllm_clover.modeling.augmenting import DecoderLayer

pytestmark = pytest.mark.unit

D, V, K = 32, 120, 3


def tiny_config(**overrides) -> CloverConfig:
    fields = dict(hidden_size=D, vocab_size=V, num_heads=K, num_attention_heads=4)
    fields.update(num_key_value_heads=2, intermediate_size=48, decoder_num_heads=4, rope_theta=1e3)
    fields.update(overrides)
    return CloverConfig(**fields)


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Give every float parameter random values (so no component is at its identity init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen) + (1.0 if p.dim() == 1 else 0.0))


def build(cfg: CloverConfig, seed: int = 0) -> tuple[CloverHeads, torch.Tensor]:
    """A model with random weights and its random target LM head."""
    torch.manual_seed(seed)
    model = CloverHeads(cfg)
    randomize(model, seed + 1)
    lm_head = torch.randn(
        cfg.vocab_size, cfg.hidden_size, generator=torch.Generator().manual_seed(seed + 2)
    )
    model.attach_target(lm_head)
    return model, lm_head


VARIANTS = {
    "clover": {},
    "no_decoder": dict(use_attention_decoder=False),
    "no_regressive": dict(use_regressive_connection=False),
    "no_augmenting": dict(use_augmenting_block=False),
    "two_layers_draft_vocab": dict(num_augmenting_layers=2, draft_vocab_size=40),
    "medusa": dict(
        use_augmenting_block=False, use_attention_decoder=False, use_regressive_connection=False
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_forward_and_propose_shapes(variant: str) -> None:
    cfg = tiny_config(**VARIANTS[variant])
    model, _ = build(cfg)
    ids = torch.randint(0, V, (2, 9))
    tokens = shift_tokens_for_heads(ids, K)
    logits = model(torch.randn(2, 9, D), tokens.input_ids)
    assert logits.shape == (2, 9, K, cfg.num_draft_tokens)
    drafts = model.propose(torch.randn(5, D), torch.randint(0, V, (5,)), num_steps=2)
    assert drafts.shape == (5, 2) and drafts.dtype == torch.int64
    assert int(drafts.min()) >= 0 and int(drafts.max()) < V


def test_propose_rejects_more_steps_than_heads() -> None:
    model, _ = build(tiny_config())
    with pytest.raises(ValueError, match="3 trained heads"):
        model.propose(torch.randn(1, D), torch.zeros(1, dtype=torch.long), num_steps=K + 1)


def test_heads_need_attached_target() -> None:
    model = CloverHeads(tiny_config())
    with pytest.raises(RuntimeError, match="attach_target"):
        model.propose(torch.randn(1, D), torch.zeros(1, dtype=torch.long), num_steps=1)
    with pytest.raises(ValueError, match="shape"):
        model.attach_target(torch.randn(V + 1, D))


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
    medusa, lm_head = build(tiny_config(**VARIANTS["medusa"]))  # random ResBlocks
    torch.manual_seed(123)
    clover = CloverHeads(tiny_config(use_augmenting_block=False, **flags))  # fresh init
    clover.blocks.load_state_dict(medusa.blocks.state_dict())
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
    total = cfg.num_heads * (d * d + d)  # ResBlocks with bias
    if cfg.use_augmenting_block:
        total += cfg.num_augmenting_layers * layer + d
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
                model = CloverHeads(cfg)
            counts[heads, layers] = sum(p.numel() for p in model.parameters())
            assert counts[heads, layers] == expected_param_count(cfg)
    per_head = counts[2, 1] - counts[1, 1]
    assert counts[4, 1] - counts[2, 1] == 2 * per_head
    per_layer = counts[1, 2] - counts[1, 1]
    assert counts[1, 3] - counts[1, 2] == per_layer


def test_draft_vocab_mapping_and_logits() -> None:
    counts = torch.rand(V)
    ids = draft_vocab_from_counts(counts, 40)
    assert torch.equal(ids, torch.topk(counts, 40).indices.sort().values)
    draft, lm_head = build(tiny_config(draft_vocab_size=40))
    draft.set_draft_vocab(ids)
    full = CloverHeads(tiny_config())
    full.load_state_dict({k: v for k, v in draft.state_dict().items() if k != "draft_vocab_ids"})
    full.attach_target(lm_head)

    positions = torch.arange(40)
    assert torch.equal(draft.draft_to_target(positions), ids)
    assert torch.equal(draft.target_to_draft(ids), positions)
    outside = torch.tensor([t for t in range(V) if t not in set(ids.tolist())][:5])
    assert torch.equal(draft.target_to_draft(outside), torch.full((5,), -1))

    hidden, tok = torch.randn(2, 5, D), torch.randint(0, V, (2, 5))
    head_inputs = shift_tokens_for_heads(tok, K).input_ids
    torch.testing.assert_close(
        draft(hidden, head_inputs), full(hidden, head_inputs)[..., ids], rtol=0, atol=1e-6
    )
    with pytest.raises(ValueError, match="sorted"):
        draft.set_draft_vocab(ids.flip(0))


def manual_greedy(
    model: CloverHeads, lm_head: torch.Tensor, h0: torch.Tensor, t0: torch.Tensor, steps: int
):
    """Greedy drafting written out with explicit formulas (full Clover, lm_head embedding)."""
    dec, eps, nh = model.decoder, model.config.rms_norm_eps, model.config.decoder_num_heads
    ids = model.draft_vocab_ids
    w_vocab = lm_head if ids is None else lm_head[ids]
    h, prev, out = h0, t0, []
    for i in range(steps):
        row = lm_head[prev]
        e = row / torch.sqrt(row.pow(2).mean(-1, keepdim=True) + eps)
        hn = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * dec.norm.weight
        q = (hn @ dec.q_proj.weight.T).reshape(-1, nh, D // nh)
        k = (e @ dec.k_proj.weight.T).reshape(-1, nh, D // nh)
        v = (e @ dec.v_proj.weight.T).reshape(-1, nh, D // nh)
        cos = (q * k).sum(-1) / (q.norm(dim=-1) * k.norm(dim=-1))
        h = h + (cos.unsqueeze(-1) * v).reshape(-1, D)
        lin = model.blocks[i].layers[0]
        z = h + F.silu(h @ lin.weight.T + lin.bias)
        best = (z @ w_vocab.T).argmax(-1)
        prev = best if ids is None else ids[best]
        out.append(prev)
    return torch.stack(out, -1)


@pytest.mark.parametrize("draft_vocab_size", [None, 40])
def test_propose_equals_manual_greedy(draft_vocab_size: int | None) -> None:
    model, lm_head = build(
        tiny_config(use_augmenting_block=False, draft_vocab_size=draft_vocab_size)
    )
    if draft_vocab_size:
        model.set_draft_vocab(torch.randperm(V)[:draft_vocab_size].sort().values)
    h0, t0 = torch.randn(6, D), torch.randint(0, V, (6,))
    with torch.no_grad():
        expected = manual_greedy(model, lm_head, h0, t0, K)
    assert torch.equal(model.propose(h0, t0, K), expected)


def test_ablation_step_formulas() -> None:
    """No decoder: h_i = h0 + W_R e; no regressive: e = learned step vector; Medusa: h_i = h0."""
    h_prev, h0, prev = torch.randn(4, D), torch.randn(4, D), torch.randint(0, V, (4,))
    model, _ = build(tiny_config(**VARIANTS["no_decoder"]))
    with torch.no_grad():
        h, _ = model.step(1, h_prev, h0, prev)
        torch.testing.assert_close(
            h, h0 + model.embed_tokens(prev) @ model.regressive_proj.weight.T
        )

        model, _ = build(tiny_config(**VARIANTS["no_regressive"]))
        h, _ = model.step(2, h_prev, h0, prev)
        torch.testing.assert_close(
            h, model.decoder(h_prev, model.step_embed.weight[2].expand(4, D))
        )
        model, _ = build(tiny_config(**VARIANTS["medusa"]))
        h, z = model.step(1, h_prev, h0, prev)
        assert torch.equal(h, h0) and torch.equal(z, model.blocks[1](h0))


@pytest.mark.parametrize(
    "variant", ["clover", "no_decoder", "no_regressive", "two_layers_draft_vocab"]
)
def test_teacher_forced_forward_equals_propose(variant: str) -> None:
    model, _ = build(tiny_config(**VARIANTS[variant]))
    hidden, t, t0 = torch.randn(1, 8, D), 5, torch.tensor([17])
    with torch.no_grad():
        h0 = model.augment(hidden)[:, t]  # (1, D)
    drafts = model.propose(h0, t0, K)  # (1, K) target ids
    head_inputs = torch.zeros(1, 8, K, dtype=torch.long)
    head_inputs[0, t] = torch.cat([t0, drafts[0, :-1]])  # [t0, own argmax 0, own argmax 1]
    with torch.no_grad():
        logits = model(hidden, head_inputs)  # (1, 8, K, N)
    assert torch.equal(model.draft_to_target(logits[0, t].argmax(-1)), drafts[0])


def test_regressive_table_holds_the_decoder_kv_of_each_draft_token() -> None:
    """Drafting looks k, v of its own drafts up instead of computing them; kept in sync."""
    model, _ = build(tiny_config(**VARIANTS["two_layers_draft_vocab"]))
    table = model.regressive_table()  # (N, 2D)
    with torch.no_grad():
        expected = model.decoder.key_value(model.embed_tokens(model.draft_vocab_ids))
    assert table.shape == (40, 2 * D) and torch.equal(table, expected)
    assert model.regressive_table() is table  # built once
    with torch.no_grad():
        model.decoder.v_proj.weight.mul_(2.0)  # e.g. an optimizer step, in place
    rebuilt = model.regressive_table()
    assert rebuilt is not table and torch.equal(rebuilt[:, D:], 2.0 * table[:, D:])
    for variant in ("clover", "no_regressive", "no_decoder"):  # full vocab / no token input
        assert build(tiny_config(**VARIANTS[variant]))[0].regressive_table() is None


def test_shift_tokens_for_heads_worked_example() -> None:
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    out = shift_tokens_for_heads(ids, 2, pad_id=-1)
    assert out.input_ids[0].T.tolist() == [[11, 12, 13, 14, 15, -1], [12, 13, 14, 15, -1, -1]]
    assert out.target_ids[0].T.tolist() == [[12, 13, 14, 15, -1, -1], [13, 14, 15, -1, -1, -1]]
    assert out.mask[0].T.int().tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    padded = shift_tokens_for_heads(ids, 2, attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0]]))
    assert padded.mask[0].T.int().tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]


def test_regressive_embedding_sources() -> None:
    model, lm_head = build(tiny_config())
    e = model.embed_tokens(torch.tensor([3, 7]))
    torch.testing.assert_close(e.pow(2).mean(-1), torch.ones(2), rtol=0, atol=1e-4)
    torch.testing.assert_close(e[0] / e[0].norm(), lm_head[3] / lm_head[3].norm())

    cfg = tiny_config(regressive_embedding="input_embedding")
    emb_model = CloverHeads(cfg)
    with pytest.raises(ValueError, match="input embedding"):
        emb_model.attach_target(lm_head)
    table = torch.randn(V, D)
    emb_model.attach_target(lm_head, table)
    assert torch.equal(emb_model.embed_tokens(torch.tensor([3])), table[[3]])
    assert emb_model.lm_head_weight.data_ptr() == lm_head.data_ptr()  # shared, not copied
    assert "lm_head_weight" not in emb_model.state_dict()


# ---------------------------------------------------------------- augmenting block
def tiny_llama(num_layers: int):
    """A random 'target': a tiny transformers LlamaModel and its config."""
    transformers = pytest.importorskip("transformers")
    target_cfg = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=48, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=V, rope_theta=500.0, rms_norm_eps=1e-5,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaModel(target_cfg).eval(), target_cfg


def test_init_augmenting_from_target_copies_weights() -> None:
    target, target_cfg = tiny_llama(num_layers=3)
    cfg = CloverConfig.from_target_config(target_cfg, num_heads=2, num_augmenting_layers=2)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.num_key_value_heads, cfg.head_dim) == (
        500.0, 1e-5, 2, 8,
    )  # fmt: skip
    model, _ = build(cfg)
    state = {f"model.{k}": v for k, v in target.state_dict().items()}  # prefixes are stripped
    states = select_last_layers(state, 2)
    init_augmenting_from_target(model, states, state["model.norm.weight"])
    for j, src in ((0, 1), (1, 2)):
        for name, p in model.layers[j].named_parameters():
            assert torch.equal(p, state[f"model.layers.{src}.{name}"]), name
    assert torch.equal(model.norm.weight, state["model.norm.weight"])

    broken = {k: v for k, v in states[0].items() if k != "mlp.up_proj.weight"}
    with pytest.raises(ValueError, match="mlp.up_proj.weight"):
        init_augmenting_from_target(model, [broken, states[1]], state["model.norm.weight"])
    with pytest.raises(ValueError, match="norm.weight"):
        init_augmenting_from_target(model, states, torch.randn(D + 1))


def test_augmenting_block_matches_transformers_llama() -> None:
    """A block initialised from a 2-layer HF Llama equals that model run on inputs_embeds."""
    target, target_cfg = tiny_llama(num_layers=2)
    cfg = CloverConfig.from_target_config(target_cfg, num_heads=2, num_augmenting_layers=2)
    model = CloverHeads(cfg)
    state = target.state_dict()
    init_augmenting_from_target(model, select_last_layers(state, 2), state["norm.weight"])
    hidden, positions = torch.randn(2, 6, D), torch.arange(6) + 4
    with torch.no_grad():
        expected = target(inputs_embeds=hidden, position_ids=positions.expand(2, 6))
        got = model.augment(hidden, positions)
    torch.testing.assert_close(got, expected.last_hidden_state, rtol=1e-5, atol=1e-5)


def rms(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(vec: torch.Tensor, pos: float, theta: float) -> torch.Tensor:
    """RoPE by hand: rotate each pair (c, c + hd/2) of vec (hd,) by pos * theta^(-2c/hd)."""
    hd, out = vec.shape[0], vec.clone()
    for c in range(hd // 2):
        cos, sin = math.cos(pos * theta ** (-2 * c / hd)), math.sin(pos * theta ** (-2 * c / hd))
        a, b = vec[c], vec[c + hd // 2]
        out[c], out[c + hd // 2] = a * cos - b * sin, b * cos + a * sin
    return out


def naive_decoder_layer(layer: DecoderLayer, x: torch.Tensor, pos: torch.Tensor, cfg: CloverConfig):
    """Loop reference for x (T, D): per-query softmax over keys <= t, GQA by head index."""
    att, hd, eps = layer.self_attn, cfg.head_dim, cfg.rms_norm_eps
    nh, nkv, T = cfg.num_attention_heads, cfg.num_key_value_heads, x.shape[0]
    xn = rms(x, layer.input_layernorm.weight, eps)
    q = (xn @ att.q_proj.weight.T).view(T, nh, hd)
    k = (xn @ att.k_proj.weight.T).view(T, nkv, hd)
    v = (xn @ att.v_proj.weight.T).view(T, nkv, hd)
    y = torch.zeros(T, nh, hd)
    for h in range(nh):
        g = h // (nh // nkv)
        for t in range(T):
            qt = rotate(q[t, h], float(pos[t]), cfg.rope_theta)
            keys = [rotate(k[s, g], float(pos[s]), cfg.rope_theta) for s in range(t + 1)]
            scores = torch.stack([qt @ key for key in keys]) / math.sqrt(hd)
            y[t, h] = (scores.softmax(0).unsqueeze(-1) * v[: t + 1, g]).sum(0)
    h1 = x + y.reshape(T, nh * hd) @ att.o_proj.weight.T
    hn, mlp = rms(h1, layer.post_attention_layernorm.weight, eps), layer.mlp
    gated = F.silu(hn @ mlp.gate_proj.weight.T) * (hn @ mlp.up_proj.weight.T)
    return h1 + gated @ mlp.down_proj.weight.T


def test_decoder_layer_and_augment_match_naive_reference() -> None:
    cfg = tiny_config(hidden_size=16, num_attention_heads=4, num_key_value_heads=2)
    model, _ = build(cfg)  # random weights, norm weights around 1
    x, positions = torch.randn(1, 5, 16), torch.arange(5) + 7
    with torch.no_grad():
        slow = naive_decoder_layer(model.layers[0], x[0], positions, cfg)
        fast = model.layers[0](x, positions.unsqueeze(0))
        torch.testing.assert_close(fast[0], slow, rtol=1e-5, atol=1e-5)
        expected = rms(slow, model.norm.weight, cfg.rms_norm_eps)  # augment = norm(layers(H))
        torch.testing.assert_close(model.augment(x, positions)[0], expected, rtol=1e-5, atol=1e-5)
    off, _ = build(tiny_config(use_augmenting_block=False))
    hidden = torch.randn(2, 4, D)
    assert torch.equal(off.augment(hidden), hidden)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(decoder_num_heads=5), "decoder_num_heads=5"),
        (dict(num_heads=0), "num_heads must be >= 1"),
        (dict(regressive_embedding="tied"), "regressive_embedding"),
        (dict(draft_vocab_size=V + 1), "draft_vocab_size"),
        (dict(num_key_value_heads=3), "num_key_value_heads=3"),
        (dict(hidden_act="gelu"), "silu"),
        (dict(target_hidden_size=D + 1), "target_hidden_size"),
    ],
)
def test_config_validation(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_config_medusa_and_round_trip() -> None:
    med = CloverConfig.medusa(hidden_size=D, vocab_size=V, num_heads=4)
    assert med.is_medusa and med.num_hidden_layers == 0 and med.architectures == ["CloverModel"]
    assert not tiny_config().is_medusa and tiny_config().num_hidden_layers == 1
    with pytest.raises(ValueError, match="num_hidden_layers is derived"):
        tiny_config(num_hidden_layers=2)
    cfg = tiny_config(draft_vocab_size=40, target_name="tiny", target_lm_head_fingerprint="v1:x")
    again = CloverConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict() and again.model_type == "clover"


def test_modeling_does_not_import_vllm() -> None:
    code = (
        "import sys, vllm_clover.modeling; "
        "sys.exit(any(m.split('.')[0] == 'vllm' for m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_draft_vocab_rows_are_gathered_once_and_refreshed_on_change():
    model = CloverHeads(tiny_config(draft_vocab_size=16))
    model.set_draft_vocab(torch.arange(16) * 3)
    lm_head = torch.randn(V, D)
    model.attach_target(lm_head)
    first = model.vocab_weight()
    assert model.vocab_weight() is first  # cached between drafting steps
    assert torch.equal(first, lm_head[torch.arange(16) * 3])
    model.draft_vocab_ids.copy_(torch.arange(16))  # e.g. load_state_dict, in place
    assert torch.equal(model.vocab_weight(), lm_head[:16])
    other = torch.randn(V, D)
    model.attach_target(other)
    assert torch.equal(model.vocab_weight(), other[:16])


def test_bf16_heads_score_bf16_rows_of_an_fp32_lm_head():
    """Drafting in bf16 on an fp32 target: the gathered rows follow the heads' dtype."""
    model = CloverHeads(tiny_config(draft_vocab_size=16)).to(torch.bfloat16)
    model.set_draft_vocab(torch.arange(16) * 3)
    lm_head = torch.randn(V, D)  # the target's, float32, shared
    model.attach_target(lm_head)
    rows = model.vocab_weight()
    assert rows.dtype == torch.bfloat16
    assert torch.equal(rows, lm_head[torch.arange(16) * 3].to(torch.bfloat16))
    drafts = model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2)  # fp32 h0 in
    assert drafts.shape == (3, 2) and drafts.dtype == torch.int64
    assert set(drafts.flatten().tolist()) <= set((torch.arange(16) * 3).tolist())


def test_fp32_heads_can_score_bf16_rows():
    """Drafting scores its own copy of the rows (scoring_dtype); training keeps fp32 ones."""
    model, lm_head = build(tiny_config(draft_vocab_size=16))
    model.set_draft_vocab(torch.arange(16) * 3)
    model.scoring_dtype = torch.bfloat16
    rows = model.draft_rows()
    assert model.dtype == torch.float32 and rows.dtype == torch.bfloat16 and rows.scale is None
    assert torch.equal(rows.weight, lm_head[torch.arange(16) * 3].to(torch.bfloat16))
    assert model.draft_rows() is rows and model.vocab_weight().dtype == torch.float32
    z = torch.randn(5, D)
    expected = F.linear(z.bfloat16(), rows.weight).float()
    torch.testing.assert_close(rows.scores(z).float(), expected, rtol=1e-2, atol=1e-2)
    assert model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2).shape == (3, 2)


def test_int8_draft_rows_score_like_the_float_rows():
    """int8 rows (the CPU default): scores = z . W[j] up to one positive factor per row of z."""
    model, lm_head = build(tiny_config(draft_vocab_size=16))
    model.set_draft_vocab(torch.arange(16) * 3)
    model.scoring_dtype = torch.int8
    rows = model.draft_rows()
    assert rows.dtype == torch.int8 and rows.scale.shape == (16,)
    exact = lm_head[torch.arange(16) * 3]
    torch.testing.assert_close(rows.weight.float() * rows.scale[:, None], exact,
                               rtol=0, atol=float(rows.scale.max()) / 2 + 1e-6)
    z = torch.randn(64, D)
    z_scale = z.abs().amax(-1, keepdim=True) / 127  # the factor scores() leaves out
    got, expected = rows.scores(z) * z_scale, F.linear(z, exact)
    assert got.shape == (64, 16) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.15)
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.9, agree  # near-ties may differ: drafts only propose
    drafts = model.propose(torch.randn(3, D), torch.tensor([1, 2, 3]), 2)
    assert set(drafts.flatten().tolist()) <= set((torch.arange(16) * 3).tolist())


def test_quantize_int8_worked_example():
    from vllm_clover.modeling.scoring import quantize_int8

    q, scale = quantize_int8(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]]))
    assert q.dtype == torch.int8 and q.tolist() == [[64, -127, 32], [0, 0, 0]]
    torch.testing.assert_close(scale, torch.tensor([1 / 127, 1e-12 / 127]))


@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_scores_equal_linear(rows: int, dtype: torch.dtype):
    """The bf16 CPU path (w @ x^T, one row duplicated) scores as F.linear does."""
    from vllm_clover.modeling.scoring import row_scores

    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, D, generator=gen), torch.randn(40, D, generator=gen)
    got = row_scores(x.to(dtype), w.to(dtype))
    assert got.shape == (rows, 40) and got.dtype == dtype
    torch.testing.assert_close(got.float(), F.linear(x, w), rtol=2e-2, atol=5e-2)
    assert torch.equal(row_scores(x[None], w), F.linear(x[None], w))  # (..., D): F.linear
