"""The head loop: greedy drafting against hand-written formulas, the ablations' step, the
regressive k, v table, and its step limit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import D, K, V, random_clover, tiny_config
from vllm_clover.modeling import CloverModel

pytestmark = pytest.mark.unit

VARIANTS = {
    "clover": {},
    "no_decoder": dict(use_attention_decoder=False),
    "no_regressive": dict(use_regressive_connection=False),
    "draft_vocab": dict(draft_vocab_size=40),
    "medusa": dict(use_attention_decoder=False, use_regressive_connection=False),
}


def manual_greedy(
    model: CloverModel, lm_head: torch.Tensor, h0: torch.Tensor, t0: torch.Tensor, steps: int
) -> torch.Tensor:
    """Greedy drafting written out with explicit formulas (full Clover, lm_head embedding)."""
    heads, cfg = model.heads, model.config
    dec, eps, nh = heads.decoder, cfg.rms_norm_eps, cfg.decoder_num_heads
    ids = model.tables.draft_vocab_ids
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
        lin = heads.blocks[i].layers[0]
        z = h + F.silu(h @ lin.weight.T + lin.bias)
        best = (z @ w_vocab.T).argmax(-1)
        prev = best if ids is None else ids[best]
        out.append(prev)
    return torch.stack(out, -1)


@pytest.mark.parametrize("draft_vocab_size", [None, 40])
def test_propose_equals_manual_greedy(draft_vocab_size: int | None) -> None:
    model, lm_head = random_clover(
        tiny_config(use_augmenting_block=False, draft_vocab_size=draft_vocab_size)
    )
    h0, t0 = torch.randn(6, D), torch.randint(0, V, (6,))
    with torch.no_grad():
        expected = manual_greedy(model, lm_head, h0, t0, K)
    assert torch.equal(model.heads.propose(h0, t0, K, model.tables), expected)


def head_probabilities(model: CloverModel, h0: torch.Tensor, t0: torch.Tensor) -> torch.Tensor:
    """(M, K) each head's probability of its greedy draft along the unstopped chain."""
    heads, tables = model.heads, model.tables
    rows, h, prev, probs = tables.draft_rows(heads.dtype), h0, t0, []
    for i in range(K):
        h, z = heads.step(i, h, h0, prev, tables)
        logits = z @ tables.vocab_weight(torch.float32).T  # (M, N)
        probs.append(F.softmax(logits, dim=-1).max(-1).values)
        prev = tables.draft_to_target(tables.best_draft(z, rows)[0])
    return torch.stack(probs, -1)


@pytest.mark.parametrize("draft_vocab_size", [None, 40])
def test_confidence_stop_cuts_each_chain_at_its_first_unsure_head(draft_vocab_size) -> None:
    """Thresholds in the middle of each head's probabilities: every request keeps the leading
    drafts whose heads were sure enough, -1 from its first unsure head on."""
    model, _ = random_clover(
        tiny_config(use_augmenting_block=False, draft_vocab_size=draft_vocab_size)
    )
    h0, t0 = torch.randn(16, D), torch.randint(0, V, (16,))
    with torch.no_grad():
        full = model.heads.propose(h0, t0, K, model.tables)
        probs = head_probabilities(model, h0, t0)  # (16, K)
    ordered = probs.sort(dim=0).values  # (16, K); thresholds halfway between two of them,
    thresholds = (ordered[7] + ordered[8]) / 2  # so float rounding cannot flip a comparison
    cut = model.heads.propose(h0, t0, K, model.tables, thresholds)
    keep = (probs >= thresholds).long().cumprod(dim=-1).bool()  # (16, K) leading sure heads
    assert torch.equal(cut, torch.where(keep, full, -1))
    lengths = keep.sum(-1)
    assert lengths.unique().numel() > 1  # chains of different lengths in one batch
    never = model.heads.propose(h0, t0, K, model.tables, torch.ones(K))
    assert bool((never == -1).all())  # no head is ever sure: nothing drafted, loop ended early
    always = model.heads.propose(h0, t0, K, model.tables, torch.zeros(K))
    assert torch.equal(always, full)


def test_ablation_step_formulas() -> None:
    """No decoder: h_i = h0 + W_R e; no regressive: e = learned step vector; Medusa: h_i = h0."""
    h_prev, h0, prev = torch.randn(4, D), torch.randn(4, D), torch.randint(0, V, (4,))
    with torch.no_grad():
        model, _ = random_clover(tiny_config(**VARIANTS["no_decoder"]))
        heads, tables = model.heads, model.tables
        h, _ = heads.step(1, h_prev, h0, prev, tables)
        e = tables.embed(prev, heads.dtype)
        torch.testing.assert_close(h, h0 + e @ heads.regressive_proj.weight.T)

        model, _ = random_clover(tiny_config(**VARIANTS["no_regressive"]))
        heads = model.heads
        h, _ = heads.step(2, h_prev, h0, prev, model.tables)
        torch.testing.assert_close(
            h, heads.decoder(h_prev, heads.step_embed.weight[2].expand(4, D))
        )

        model, _ = random_clover(tiny_config(**VARIANTS["medusa"]))
        h, z = model.heads.step(1, h_prev, h0, prev, model.tables)
        assert torch.equal(h, h0) and torch.equal(z, model.heads.blocks[1](h0))


def test_clover2_step_formulas() -> None:
    """Linear heads: z_i = W_i [h_i ; e] + b_i with e the token the step read; with the next
    token fused before the block, step 0 keeps h0 and only projects it."""
    h_prev, h0, prev = torch.randn(4, D), torch.randn(4, D), torch.randint(0, V, (4,))
    cfg = tiny_config(fuse_next_token=True, head_projection="linear")
    with torch.no_grad():
        model, _ = random_clover(cfg)
        heads, tables = model.heads, model.tables
        e = tables.embed(prev, heads.dtype)
        h, z = heads.step(0, h0, h0, prev, tables)
        w, b = heads.blocks[0].weight, heads.blocks[0].bias
        assert torch.equal(h, h0)
        torch.testing.assert_close(z, torch.cat([h0, e], -1) @ w.T + b)
        h, z = heads.step(1, h_prev, h0, prev, tables)
        torch.testing.assert_close(h, heads.decoder(h_prev, e))
        w, b = heads.blocks[1].weight, heads.blocks[1].bias
        torch.testing.assert_close(z, torch.cat([h, e], -1) @ w.T + b)


def test_clover2_without_the_attention_decoder_projects_the_token() -> None:
    """Clover-2's order without the head loop's Attention Decoder: the later heads read
    their token through W_R alone, h_i = h0 + W_R e; step 0 keeps the fused h0."""
    h_prev, h0, prev = torch.randn(4, D), torch.randn(4, D), torch.randint(0, V, (4,))
    cfg = tiny_config(fuse_next_token=True, head_projection="linear", use_attention_decoder=False)
    with torch.no_grad():
        model, _ = random_clover(cfg)
        heads, tables = model.heads, model.tables
        assert heads.decoder is None and heads.regressive_proj is not None
        e = tables.embed(prev, heads.dtype)
        assert torch.equal(heads.step(0, h0, h0, prev, tables)[0], h0)
        h, _ = heads.step(1, h_prev, h0, prev, tables)
        torch.testing.assert_close(h, h0 + heads.regressive_proj(e))
        drafts = model.propose(h0, prev, num_steps=K)
    assert drafts.shape == (4, K)


def test_fresh_linear_head_is_the_identity() -> None:
    torch.manual_seed(0)
    heads = CloverModel(tiny_config(head_projection="linear")).heads
    h, e = torch.randn(3, D), torch.randn(3, D)
    assert torch.equal(heads.blocks[2](h, e), h)


def test_propose_rejects_more_steps_than_heads() -> None:
    model, _ = random_clover(tiny_config())
    with pytest.raises(ValueError, match="3 trained heads"):
        model.propose(torch.randn(1, D), torch.zeros(1, dtype=torch.long), num_steps=K + 1)
    with pytest.raises(ValueError, match=r"must be in \[1, 3\]"):
        model.heads.teacher_forced(
            torch.randn(1, 2, D), torch.zeros(1, 2, 0, dtype=torch.long), model.tables
        )


def test_head_loop_owns_no_vocabulary_sized_tensor() -> None:
    model, _ = random_clover(tiny_config(draft_vocab_size=40))
    sizes = [t.numel() for t in model.heads.state_dict().values()]
    assert max(sizes) <= D * D and "draft_vocab_ids" not in model.heads.state_dict()
