"""Clover draft heads in plain PyTorch (arXiv 2405.00263), shared by trainer and vLLM wrapper.

Indexing convention (used everywhere in this package)::

    H_t       target hidden state at position t (post final norm, after reading x_0..x_t)
    t0        x_{t+1}: the token the target's own LM head produced from H_t
    head i    (0-based) predicts x_{t+2+i}; its regressive input is x_{t+1+i}
              (head 0 reads t0 = x_{t+1}, head 1 reads x_{t+2}, ...)

Per head step i (one function, ``CloverHeads.step``, used for training and drafting)::

    h0  = AugmentingBlock(H)_t            (or H_t when the block is off)
    e   = emb(x_{t+1+i})                  regressive embedding of the previous token
    h_i = h_{i-1} + cos(q, k) * v         attention decoder, q = W_Q norm(h_{i-1}),
                                          k = W_K e, v = W_V e (per decoder head)
    z_i = h_i + SiLU(W_i h_i + b_i)       per-head residual block
    logits_i = z_i @ W_lm[draft_vocab_ids]^T
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from vllm_clover.modeling.augmenting import DecoderLayer, RMSNorm, normalize_positions
from vllm_clover.modeling.config import CloverConfig
from vllm_clover.modeling.scoring import DraftRows, check_draft_vocab


class ResidualBlock(nn.Module):
    """Medusa's head block ``x + SiLU(Linear(x))`` with bias, zero-initialised (= identity).

    Same layout as vLLM's ``medusa.ResidualBlock`` with ``medusa_fc_bias=True``:
    ``layers.{j}.weight`` (D, D) and ``layers.{j}.bias`` (D,).
    """

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


class AttentionDecoder(nn.Module):
    """One query, one key: ``h + concat_h(cos(q_h, k_h) * v_h)``, no output projection.

    With a single key per query a softmax is constant, so each decoder head is gated by
    the cosine similarity of its query and key slice. Init: W_Q, W_K = I + N(0, noise_std),
    W_V = 0, so the decoder is exactly the identity on h at initialisation.
    """

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
        return self.attend(h, self.key_value(e))

    def key_value(self, e: torch.Tensor) -> torch.Tensor:
        """[k | v] of previous-token embeddings: (..., D) -> (..., 2D), one product with
        [W_K; W_V]. Depends on the token only, so drafting can look it up in a table
        (CloverHeads.regressive_table)."""
        return F.linear(e, torch.cat([self.k_proj.weight, self.v_proj.weight]))

    def attend(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        # h: previous hidden (..., D); kv: [k | v] from key_value (..., 2D)
        split = (self.num_heads, -1)
        q = self.q_proj(self.norm(h)).unflatten(-1, split)  # (..., nh, D/nh)
        k, v = (x.unflatten(-1, split) for x in kv.chunk(2, dim=-1))  # (..., nh, D/nh) each
        gate = F.cosine_similarity(q, k, dim=-1, eps=1e-6).unsqueeze(-1)  # (..., nh, 1)
        return h + (gate * v).flatten(-2)  # (..., D)


class CloverHeads(nn.Module):
    """Clover draft network: Augmenting Block + recurrent Attention Decoder + K heads.

    The target's LM head ``W_lm`` (V, D) and input embedding are not parameters:
    call ``attach_target`` to register them as frozen non-persistent buffers (shared
    storage, never saved). Attach after any ``.to(dtype)``, which would copy them.
    Entry points: ``forward`` (teacher-forced logits, training) and ``propose``
    (greedy regressive drafting); both run ``step`` once per head.
    """

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        d, k = config.hidden_size, config.num_heads
        n_aug = config.num_augmenting_layers if config.use_augmenting_block else 0
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(n_aug)])
        self.norm = RMSNorm(d, config.rms_norm_eps) if n_aug else None
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
        self.blocks = nn.ModuleList([ResidualBlock(d) for _ in range(k)])
        draft_ids = torch.arange(config.draft_vocab_size) if config.draft_vocab_size else None
        # (N,) target ids, strictly increasing; saved. The target tensors are not saved.
        self.register_buffer("draft_vocab_ids", draft_ids, persistent=True)
        self.register_buffer("lm_head_weight", None, persistent=False)  # (V, D) target, shared
        self.register_buffer("input_embedding", None, persistent=False)  # (V, D) target, shared
        # W_lm[draft_vocab_ids], gathered once: (key of its inputs, rows); see vocab_weight
        self._vocab_rows: tuple[tuple, torch.Tensor] | None = None
        self._draft_rows: tuple[tuple, DraftRows] | None = None  # the same, for drafting
        self._regressive_table: tuple[tuple, torch.Tensor] | None = None  # see its method
        # format drafting scores the rows in (scoring.DraftRows); None = the heads' dtype
        self.scoring_dtype: torch.dtype | None = None

    # ------------------------------------------------------------------ target tensors
    def attach_target(
        self, lm_head_weight: torch.Tensor, input_embedding: torch.Tensor | None = None
    ) -> None:
        """Share the target's LM head (V, D) and optionally its input embedding (V, D)."""
        cfg = self.config
        expected = (cfg.vocab_size, cfg.hidden_size)
        for name, w in (("lm_head_weight", lm_head_weight), ("input_embedding", input_embedding)):
            if w is not None and tuple(w.shape) != expected:
                raise ValueError(
                    f"{name} has shape {tuple(w.shape)}, expected (vocab, hidden) = {expected}"
                )
        if cfg.needs_input_embedding and input_embedding is None:
            raise ValueError(
                "regressive_embedding='input_embedding' needs the target input embedding"
            )
        self.lm_head_weight = lm_head_weight.detach()
        self.input_embedding = None if input_embedding is None else input_embedding.detach()

    def _lm_head(self) -> torch.Tensor:
        if self.lm_head_weight is None:
            raise RuntimeError(
                "CloverHeads: call attach_target(lm_head_weight) before running the heads"
            )
        return self.lm_head_weight

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].layers[0].weight.dtype

    @property
    def rows_dtype(self) -> torch.dtype:
        """dtype drafting scores the draft-vocabulary rows in: scoring_dtype, else the heads'."""
        return self.scoring_dtype or self.dtype

    # ------------------------------------------------------------------ vocabulary
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Set the (N,) draft vocabulary: unique target ids, strictly increasing."""
        if self.draft_vocab_ids is None:
            raise ValueError("draft_vocab_size is None: this model uses the full vocabulary")
        check_draft_vocab(token_ids, self.config.draft_vocab_size, self.config.vocab_size)
        self.draft_vocab_ids.copy_(token_ids)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab indices (any shape) -> target token ids. Identity for the full vocab."""
        return draft_ids if self.draft_vocab_ids is None else self.draft_vocab_ids[draft_ids]

    def target_to_draft(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape) -> draft-vocab indices, -1 where not in the draft vocab.

        Example: draft_vocab_ids = [2, 5, 9]; [5, 3, 9] -> [1, -1, 2].
        """
        if self.draft_vocab_ids is None:
            return token_ids
        ids = self.draft_vocab_ids
        pos = torch.searchsorted(ids, token_ids).clamp_(max=ids.numel() - 1)
        return torch.where(ids[pos] == token_ids, pos, torch.full_like(pos, -1))

    def vocab_weight(self) -> torch.Tensor:
        """Rows of W_lm the heads score against: (N, D) (a gather when a draft vocab is set).

        In the heads' dtype, for training (``logits``). The gather (N x D, e.g. 19 MB for
        N = 8192, D = 576 in fp32) is done once and reused while neither W_lm nor
        draft_vocab_ids changes (identity and in-place version). The full vocabulary is W_lm
        itself, never copied.
        """
        ids = self.draft_vocab_ids
        if ids is None:
            return self._lm_head()
        key = self._rows_key(self.dtype)
        if self._vocab_rows is None or self._vocab_rows[0] != key:
            self._vocab_rows = (key, self._lm_head().index_select(0, ids).to(self.dtype))
        return self._vocab_rows[1]

    def draft_rows(self) -> DraftRows:
        """The same rows for drafting, in ``rows_dtype`` (e.g. int8 on CPU: a quarter of the
        bytes an fp32 target reads per head step); gathered once, cached like vocab_weight."""
        key = self._rows_key(self.rows_dtype)
        if self._draft_rows is None or self._draft_rows[0] != key:
            w, ids = self._lm_head(), self.draft_vocab_ids
            rows = w if ids is None else w.index_select(0, ids)
            self._draft_rows = (key, DraftRows.of(rows, self.rows_dtype))
        return self._draft_rows[1]

    def _rows_key(self, dtype: torch.dtype) -> tuple:
        """What gathered rows depend on: W_lm and draft_vocab_ids (identity, in-place
        version), and the dtype they are kept in."""
        w, ids = self._lm_head(), self.draft_vocab_ids
        return (id(w), w._version, w.dtype, w.device, dtype,
                None if ids is None else (id(ids), ids._version))

    def logits(self, z: torch.Tensor, vocab_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Head features z (..., D) -> logits (..., N) in the heads' dtype (training)."""
        w = self.vocab_weight() if vocab_weight is None else vocab_weight
        return F.linear(z.to(w.dtype), w)

    # ------------------------------------------------------------------ network
    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Regressive embedding e of target ids (...,) -> (..., D).

        "lm_head": the W_lm row divided by its RMS (gathered, never copied whole);
        "input_embedding": the raw row of the target input embedding table.
        """
        if self.config.regressive_embedding == "input_embedding":
            if self.input_embedding is None:
                raise RuntimeError(
                    "CloverHeads: attach_target(..., input_embedding=...) is required"
                )
            return self.lookup_rows(token_ids, self.input_embedding).to(self.dtype)
        rows = self.lookup_rows(token_ids, self._lm_head()).float()  # (..., D)
        rows = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return rows.to(self.dtype)

    def lookup_rows(self, token_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Rows of a (V, D) target table for ids (...,) -> (..., D); sharded under TP."""
        return F.embedding(token_ids, table)

    def greedy_draft_ids(self, z: torch.Tensor, rows: DraftRows) -> torch.Tensor:
        """Draft-vocab indices of the best-scoring rows: head features (N, D) -> (N,) int64."""
        return rows.scores(z).argmax(dim=-1)

    def augment(
        self, hidden_states: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """h0 for every position: Augmenting Block over H (B, T, D), or H itself when off.

        positions: (T,) or (B, T), default arange(T); only RoPE uses them, the mask is
        causal over the T axis (right padding only).
        """
        x = hidden_states.to(self.dtype)
        if not self.layers:
            return x
        b, t, _ = x.shape
        pos = normalize_positions(positions, b, t, x.device)  # (B, T)
        for layer in self.layers:
            x = layer(x, pos)
        return self.norm(x)  # (B, T, D)

    def step(
        self, i: int, h_prev: torch.Tensor, h0: torch.Tensor, prev_ids: torch.Tensor,
        kv: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head step i: (h_{i-1}, h0, previous token) -> (h_i, z_i). All (..., D), prev_ids (...,).

        prev_ids are target ids of x_{t+1+i} (step 0: t0). kv: the decoder's [k | v] of
        prev_ids (..., 2D) when the caller has it (drafting's regressive_table), else it is
        computed here. Returns h_i (input of the next step) and z_i = ResBlock_i(h_i)
        (feed to ``logits``).
        """
        cfg = self.config
        if self.decoder is not None:
            if kv is None:
                if self.step_embed is not None:
                    e = self.step_embed.weight[i].expand_as(h_prev)  # learned e_{i-1}
                else:
                    e = self.embed_tokens(prev_ids)
                kv = self.decoder.key_value(e)
            h = self.decoder.attend(h_prev, kv)
        elif cfg.use_regressive_connection:
            h = h0 + self.regressive_proj(self.embed_tokens(prev_ids))
        else:
            h = h0  # Medusa-1
        return h, self.blocks[i](h)

    def head_features(
        self,
        hidden_states: torch.Tensor,
        head_input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced z for every position and head: (B, T, K', D), K' = #columns of ids.

        hidden_states: (B, T, D) target H; head_input_ids: (B, T, K') from
        ``shift_tokens_for_heads`` (column i = x_{t+1+i}). Use this plus ``logits``
        in chunks when (B, T, K, N) logits are too large.
        """
        num_steps = head_input_ids.shape[-1]
        self._check_steps(num_steps)
        h0 = self.augment(hidden_states, positions)  # (B, T, D)
        h, features = h0, []
        for i in range(num_steps):
            h, z = self.step(i, h, h0, head_input_ids[..., i])
            features.append(z)
        return torch.stack(features, dim=2)  # (B, T, K', D)

    def forward(
        self,
        hidden_states: torch.Tensor,
        head_input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, K', N); logits[b, t, i] scores x_{t+2+i} (draft vocab)."""
        return self.logits(self.head_features(hidden_states, head_input_ids, positions))

    @torch.no_grad()
    def propose(self, h0: torch.Tensor, t0: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Greedy regressive drafting: h0 (N, D), t0 (N,) -> draft target ids (N, num_steps) int64.

        h0 is the (augmented) hidden state at the last accepted position, t0 the token
        the target produced there; each step feeds its own argmax to the next, whose
        decoder [k | v] comes from regressive_table when there is one.
        """
        self._check_steps(num_steps)
        rows, table = self.draft_rows(), self.regressive_table()
        h0 = h0.to(self.dtype)
        h, prev, kv, drafts = h0, t0, None, []
        for i in range(num_steps):
            h, z = self.step(i, h, h0, prev, kv)
            best = self.greedy_draft_ids(z, rows)  # (N,) draft-vocab indices
            drafts.append(best)
            if table is not None:
                kv = F.embedding(best, table)  # (N, 2D)
            else:
                prev = self.draft_to_target(best)  # (N,) target ids
        return self.draft_to_target(torch.stack(drafts, dim=-1)).long()  # (N, num_steps)

    def regressive_table(self) -> torch.Tensor | None:
        """The decoder's [k | v] of every draft-vocabulary token: (N, 2D), or None.

        From the second head step on, a draft's input token is the previous draft, always a
        draft-vocabulary id, and k, v depend on that token only: a row lookup replaces the
        regressive embedding and the k, v products (docs/drafting-cost.md). Built once and
        rebuilt when W_lm, the draft vocabulary or W_K, W_V change (identity, in-place
        version), like draft_rows; 2 N D values in the heads' dtype (36 MB for the reference
        heads, fp32). None without a draft vocabulary (a table of the whole vocabulary would
        be too large) or when the decoder reads no token (learned step embeddings).
        """
        if self.draft_vocab_ids is None or self.decoder is None or self.step_embed is not None:
            return None
        sources = (self.decoder.k_proj.weight, self.decoder.v_proj.weight, self.input_embedding)
        key = (self._rows_key(self.dtype),
               *((id(t), t._version) for t in sources if t is not None))
        if self._regressive_table is None or self._regressive_table[0] != key:
            embedding = self.embed_tokens(self.draft_vocab_ids)  # (N, D)
            self._regressive_table = (key, self.decoder.key_value(embedding).contiguous())
        return self._regressive_table[1]

    def _check_steps(self, num_steps: int) -> None:
        if not 1 <= num_steps <= self.config.num_heads:
            raise ValueError(
                f"asked for {num_steps} draft steps but this Clover model has "
                f"{self.config.num_heads} trained heads (num_speculative_tokens must be in "
                f"[1, {self.config.num_heads}])"
            )

