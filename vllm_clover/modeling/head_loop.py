"""The Clover head loop: Attention Decoder and per-head blocks, one ``step`` per draft token.

Indexing (used everywhere in this package): H_t is the target's post-norm hidden state at t,
t0 = x_{t+1} its own next token; head i (0-based) reads x_{t+1+i} and predicts x_{t+2+i}.
The loop owns only D x D layers: everything vocabulary-sized is read through the TargetTables
passed to each call, so one loop runs in training, in vLLM and on a tensor-parallel rank.
Formulas: docs/checkpoint-format.md, "Indexing convention"; docs/design/network.md.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.modeling.augmenting import RMSNorm
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.draft_sampling import DraftSampler
from vllm_clover.modeling.scoring import DraftRows
from vllm_clover.modeling.tables import TargetTables, best_of


class ResidualBlock(nn.Module):
    """Medusa's head block ``x + SiLU(Linear(x))`` with bias, zero-initialised (= identity).

    vLLM's ``medusa.ResidualBlock`` layout: ``layers.{j}.weight`` (D, D), ``layers.{j}.bias``."""

    def __init__(self, hidden_size: int, num_layers: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(hidden_size, hidden_size, bias=True) for _ in range(num_layers)]
        )
        self.act = nn.SiLU()
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))
        return x


class LinearHead(nn.Module):
    """Clover-2's head: ``z = W [h ; e] + b``, initialised to ``z = h`` (W = [I | 0], b = 0).

    ``weight`` (D, 2D), ``bias`` (D,)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, 2 * hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        with torch.no_grad():
            self.weight[:, :hidden_size].copy_(torch.eye(hidden_size))

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # h, e: (..., D) -> (..., D)
        return self.project(torch.cat([h, e], dim=-1))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., 2D) -> W x + b (..., D): the affine map (a serving layer may use a faster
        kernel with the same weights, cpu/gemm.py)."""
        return F.linear(x, self.weight, self.bias)


class AttentionDecoder(nn.Module):
    """One query, one key: ``h + concat_h(cos(q_h, k_h) * v_h)``, no output projection.

    A softmax over one key is constant, hence the cosine gate. Init: W_Q, W_K = I + N(0,
    noise_std), W_V = 0: the identity on h (docs/design.md, section 1)."""

    def __init__(
        self, hidden_size: int, num_heads: int, eps: float, noise_std: float = 1e-3
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm = RMSNorm(hidden_size, eps)
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        with torch.no_grad():
            eye = torch.eye(hidden_size)
            self.q_proj.weight.copy_(eye + noise_std * torch.randn_like(eye))
            self.k_proj.weight.copy_(eye + noise_std * torch.randn_like(eye))
            self.v_proj.weight.zero_()

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # h: previous hidden (..., D); e: previous-token embedding (..., D)
        split = (self.num_heads, -1)
        q = self.q_proj(self.norm(h)).unflatten(-1, split)  # (..., nh, D/nh)
        k = self.k_proj(e).unflatten(-1, split)  # (..., nh, D/nh)
        v = self.v_proj(e).unflatten(-1, split)  # (..., nh, D/nh)
        gate = F.cosine_similarity(q, k, dim=-1, eps=1e-6).unsqueeze(-1)  # (..., nh, 1)
        return h + (gate * v).flatten(-2)  # (..., D)


class HeadLoop(nn.Module):
    """K heads made sequential: Attention Decoder (or W_R, or nothing) + per-head blocks.

    Entry points, both running ``step``: ``teacher_forced`` (training: every position, inputs
    from the data) and ``propose`` (drafting: each step fed its own previous draft)."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        d, k = config.hidden_size, config.num_heads
        self.decoder = (
            AttentionDecoder(d, config.decoder_num_heads, config.rms_norm_eps)
            if config.use_attention_decoder
            else None
        )
        self.regressive_proj = None  # W_R, only without the attention decoder
        if config.use_regressive_connection and not config.use_attention_decoder:
            self.regressive_proj = nn.Linear(d, d, bias=False)
            nn.init.zeros_(self.regressive_proj.weight)
        self.step_embed = None  # learned e_{i-1}, only without the regressive connection
        if config.use_attention_decoder and not config.use_regressive_connection:
            self.step_embed = nn.Embedding(k, d)
        self.linear_heads = config.head_projection == "linear"
        head = LinearHead if self.linear_heads else ResidualBlock
        self.blocks = nn.ModuleList([head(d) for _ in range(k)])

    @property
    def dtype(self) -> torch.dtype:
        return next(self.blocks[0].parameters()).dtype

    def step(
        self,
        i: int,
        h_prev: torch.Tensor,
        h0: torch.Tensor,
        prev_ids: torch.Tensor,
        tables: TargetTables,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head step i: (h_{i-1}, h0, previous token) -> (h_i, z_i). All (..., D), prev_ids (...,).

        prev_ids are target ids of x_{t+1+i} (step 0: t0). Returns h_i (the next step's input)
        and z_i (score it against ``tables.vocab_weight`` or ``tables.draft_rows``)."""
        e = None
        if self.config.fuse_next_token and i == 0:
            h = h_prev  # h0 read t0 before the Augmenting Block (BlockAdapter)
        elif self.decoder is not None:
            if self.step_embed is not None:
                e_dec = self.step_embed.weight[i].expand_as(h_prev)
            else:
                e = e_dec = tables.embed(prev_ids, self.dtype)
            h = self.decoder(h_prev, e_dec)
        elif self.regressive_proj is not None:
            e = tables.embed(prev_ids, self.dtype)
            h = h0 + self.regressive_proj(e)
        else:
            h = h0  # Medusa-1
        if not self.linear_heads:
            return h, self.blocks[i](h)
        e = tables.embed(prev_ids, self.dtype) if e is None else e
        return h, self.blocks[i](h, e)

    def teacher_forced(
        self, h0: torch.Tensor, head_input_ids: torch.Tensor, tables: TargetTables
    ) -> torch.Tensor:
        """z for every position and head: h0 (B, T, D), ids (B, T, K') -> (B, T, K', D);
        head_input_ids from ``shift_tokens_for_heads`` (column i = x_{t+1+i})."""
        num_steps = head_input_ids.shape[-1]
        self.check_steps(num_steps)
        h, features = h0, []
        for i in range(num_steps):
            h, z = self.step(i, h, h0, head_input_ids[..., i], tables)
            features.append(z)
        return torch.stack(features, dim=2)  # (B, T, K', D)

    @torch.no_grad()
    def propose(
        self,
        h0: torch.Tensor,
        t0: torch.Tensor,
        num_steps: int,
        tables: TargetTables,
        min_confidence: torch.Tensor | None = None,
        sampler: DraftSampler | None = None,
    ) -> torch.Tensor:
        """Regressive drafting: h0 (M, D), t0 (M,) -> draft target ids (M, num_steps).

        Each step feeds its draft (the argmax, or a ``sampler``'s draw, which it records) to
        the next. ``min_confidence`` (num_steps,): a chain stops at the first head whose best
        token is less likely than its entry, the rest of its row -1. How it works, with an
        example: docs/design/network.md, "The head loop: head_loop.py"."""
        self.check_steps(num_steps)
        rows = tables.draft_rows(self.dtype)
        h0 = h0.to(self.dtype)
        h, prev, drafts = h0, t0, []
        alive = torch.ones(t0.shape, dtype=torch.bool, device=t0.device)  # (M,)
        for i in range(num_steps):
            h, z = self.step(i, h, h0, prev, tables)
            threshold = None if min_confidence is None else min_confidence[i]
            best, confident = _pick(z, rows, tables, threshold, sampler)  # (M,), (M,) or None
            if confident is not None:
                alive &= confident
            ids = tables.draft_to_target(best)  # (M,) target ids
            drafts.append(ids if min_confidence is None else ids.masked_fill(~alive, -1))
            if min_confidence is not None and not bool(alive.any()):
                break
            prev = ids
        out = torch.stack(drafts, dim=-1).long()  # (M, steps drafted)
        if out.shape[-1] < num_steps:  # every chain stopped early
            out = F.pad(out, (0, num_steps - out.shape[-1]), value=-1)
        return out  # (M, num_steps)

    def check_steps(self, num_steps: int) -> None:
        """ValueError unless 1 <= num_steps <= the number of trained heads."""
        if not 1 <= num_steps <= self.config.num_heads:
            raise ValueError(
                f"asked for {num_steps} draft steps but this Clover model has "
                f"{self.config.num_heads} trained heads (num_speculative_tokens must be in "
                f"[1, {self.config.num_heads}])"
            )


def _pick(
    z: torch.Tensor,
    rows: DraftRows,
    tables: TargetTables,
    threshold: torch.Tensor | None,
    sampler: DraftSampler | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One head step's drafts from its features z (M, D): (draft-vocab indices (M,), whether
    the head's best token reaches ``threshold`` (M,) bool, None without one). The argmax, or a
    draw by ``sampler``, which scores the rows here, on one process (refused under tensor
    parallelism by checks.check_draft_sampling)."""
    if sampler is None and threshold is None:
        return tables.greedy_draft_ids(z, rows), None
    if sampler is None:
        best, prob = tables.best_draft(z, rows)
        return best, prob >= threshold
    logits = rows.logits(z)  # (M, N)
    confident = None if threshold is None else best_of(logits)[1] >= threshold
    return sampler.pick(logits), confident
