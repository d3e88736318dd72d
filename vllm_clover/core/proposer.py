"""`CloverProposer`: Clover drafting inside vLLM 0.32's V1 model runner.

An `EagleProposer` that runs EAGLE's first draft pass (the Augmenting Block over H, with the
same draft KV cache handling) with the base class's own helpers, then the head loop where
EAGLE would run K - 1 more draft-model forwards. Every base-class member it overrides, calls
or reads is listed in the patches ledger (`patches/reliances.py`, entries "proposer_*").
How it works: docs/design/drafting.md, "The proposer".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_clover.core.checks import confidence_thresholds
from vllm_clover.core.target_tables import attach_target_tables
from vllm_clover.hybrid.drafter import StepTokens, hybrid_drafter
from vllm_clover.modeling.draft_sampling import DraftSampler
from vllm_clover.patches.block_rest import rest_applies
from vllm_clover.patches.channel import RunnerChannel, channel_of
from vllm_clover.tree.draft import propose_tree

logger = init_logger("vllm.clover.proposer")


@dataclass
class DraftLog:
    """What the proposer was asked to draft, step by step (diagnostics and tests).
    keep_drafts also keeps every step's drafts (off: a long-running server would keep all)."""

    steps_by_k: Counter[int] = field(default_factory=Counter)  # propose calls per draft length
    drafts_by_length: Counter[int] = field(default_factory=Counter)  # requests per drafted length
    max_requests: int = 0  # the largest number of requests drafted for in one step
    max_step_tokens: int = 0  # the most tokens the target's forward of a step scheduled
    drawn: int = 0  # requests whose drafts were drawn at random (draft_sample_method)
    cut_short: int = 0  # chains the confidence stop ended short of their step's K (0 to K - 1)
    idle: int = 0  # K = 0 steps answered by idle_step, before the runner prepared propose
    rested: int = 0  # steps in propose with nothing for the heads (the lookup's): no block pass
    keep_drafts: bool = False
    drafts: list[list[list[int]]] = field(default_factory=list)
    signal_width: int = 0  # columns of the target rows: D, or (1 + A) * D with target layers

    def record(
        self, num_speculative_tokens: int, drafts: torch.Tensor, step_tokens: int, cut: bool
    ) -> None:
        self.steps_by_k[num_speculative_tokens] += 1
        if cut:  # a stopped chain ends in -1s (read on the host: the runner syncs here anyway)
            lengths = (drafts >= 0).sum(dim=-1).tolist()
            self.drafts_by_length.update(lengths)
            self.cut_short += sum(n < num_speculative_tokens for n in lengths)
        else:
            self.drafts_by_length[num_speculative_tokens] += drafts.shape[0]
        self.max_requests = max(self.max_requests, drafts.shape[0])
        self.max_step_tokens = max(self.max_step_tokens, step_tokens)
        if self.keep_drafts:
            self.drafts.append(drafts.tolist())


class CloverProposer(EagleProposer):
    def __init__(self, vllm_config, device: torch.device, runner=None) -> None:
        super().__init__(vllm_config, device, runner)
        self.draft_log = DraftLog()
        runner_channel = channel_of(runner, RunnerChannel)
        self.trees = None if runner_channel is None else runner_channel.trees  # None: chains
        self.min_confidence = confidence_thresholds(vllm_config, device)  # (K_max,) or None
        draft_config = vllm_config.speculative_config.draft_model_config.hf_config
        # Read by the target_signal patch: these heads want [H | L_a ...], not H.
        self.reads_target_layers = bool(getattr(draft_config, "target_layers", None))
        self.hybrid = hybrid_drafter(vllm_config, self.trees is not None)  # "lookup"
        self._runner = runner  # its input batch: the histories the lookup reads
        # May the block skip its pass at K = 0 (idle_step); set by patches/block_rest.py.
        self.may_rest = False
        # Read by the draft_lengths patch: rows may end in -1 (stopped or short chains).
        self.stops_early = self.min_confidence is not None or self.hybrid is not None

    def propose(
        self,
        num_speculative_tokens: int,
        # [num_tokens]
        target_token_ids: torch.Tensor,
        # [num_tokens]
        target_positions: torch.Tensor,
        # [num_tokens, hidden_size]
        target_hidden_states: torch.Tensor,
        # [num_reqs]: t0, the token the target just produced for each request
        next_token_ids: torch.Tensor,
        # [num_reqs]: each request's last accepted token, or None (the last scheduled one)
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,
        slot_mappings=None,
    ) -> torch.Tensor:
        """Draft a chain of K = `num_speculative_tokens` per request: [num_reqs, K] int64.
        K may change every step and may be 0; a K = 0 step that reaches `propose` still
        writes the Augmenting Block's KV cache (resting steps end in ``idle_step``)."""
        self.num_speculative_tokens = k = num_speculative_tokens
        self._last_draft_probs = None  # vLLM treats drafts as one-hot unless _propose_chain sets it
        # Rows [H | L_a ...] with target_layers (patch target_signal); fuse() -> x, H's stand-in.
        self.draft_log.signal_width = target_hidden_states.shape[-1]
        if self.trees is not None:  # the accepted paths' rows where a chain's would be
            target_token_ids, target_positions, target_hidden_states = self._chain_order(
                target_token_ids, target_positions, target_hidden_states
            )
        step = self._step_tokens(
            target_token_ids,
            target_positions,
            next_token_ids,
            token_indices_to_sample,
            common_attn_metadata,
        )
        lookups = None if step is None else self.hybrid.plan(self._runner.input_batch, step, k)
        takes_all = lookups is not None and self.hybrid.takes_all(lookups, k)
        heads_draft = bool(k) and not takes_all
        rests = self._rests(heads_draft, step)
        if self.model.layers and not rests:  # the pass writes the block's KV, h0 read or not
            h0 = self._augmenting_pass(
                target_token_ids,
                target_positions,
                target_hidden_states,
                next_token_ids,
                token_indices_to_sample,
                common_attn_metadata,
                num_rejected_tokens_gpu,
                heads_draft,
            )
        elif heads_draft:  # no Augmenting Block: h0 = x at the last accepted token
            last = _last_accepted(token_indices_to_sample, common_attn_metadata)
            h0 = self.model.fuse(target_hidden_states[last])
        if heads_draft:
            drafts = self._draft(h0, next_token_ids.long(), k, sampling_metadata)
        else:  # K = 0, or every request takes the lookup: no head loop
            drafts = torch.full((next_token_ids.shape[0], k), -1, device=next_token_ids.device)
        self.draft_log.record(k, drafts, target_token_ids.shape[0], self.stops_early)
        if lookups is not None:  # each request's chain: Clover's or the lookup's
            self.hybrid.choose(lookups, drafts, self._last_draft_probs)
        return drafts

    def idle_step(self, k: int, num_reqs: int, num_tokens: int) -> torch.Tensor | None:
        """[num_reqs, 0] drafts for a step with nothing to draft or write, else None (then
        `propose` runs): K = 0 and no lookup, where the Augmenting Block may rest
        (``may_rest``) and the runner skips what it prepares for `propose` (the block_rest
        patch asks here first; docs/design.md, section 3, "The resting block")."""
        if k or not self.may_rest or self.hybrid is not None:
            return None
        self.num_speculative_tokens = 0
        self._last_draft_probs = None
        drafts = torch.empty((num_reqs, 0), dtype=torch.int64, device=self.device)
        self.draft_log.record(0, drafts, num_tokens, self.stops_early)
        self.draft_log.idle += 1
        return drafts

    def _rests(self, heads_draft: bool, step: StepTokens | None) -> bool:
        """Whether the block skips its pass at a step where the heads draft nothing (the
        lookup's steps, here to settle its chains), except at a step that carries prompt
        tokens, whose hole would cost every later draft of the request."""
        rests = (
            self.may_rest
            and not heads_draft
            and step is not None
            and not step.carries_prompt(self._runner.input_batch)
        )
        self.draft_log.rested += rests
        return rests

    def _step_tokens(
        self, tokens, positions, t0, token_indices_to_sample, metadata
    ) -> StepTokens | None:
        """With "lookup", the step's tokens on the host, read before the Augmenting Block pass
        (which may rewrite the metadata), for ``HybridDrafter.plan`` (which also settles the
        chains verified at a step that drafts nothing)."""
        if self.hybrid is None or self._runner is None:
            return None
        last = _last_accepted(token_indices_to_sample, metadata)
        starts = metadata.query_start_loc_cpu[: t0.shape[0]]
        return StepTokens(
            tokens.cpu().numpy(),
            starts.numpy(),
            last.cpu().numpy(),
            (positions if positions.dim() == 1 else positions[0]).cpu().numpy()[starts.numpy()],
            t0.cpu().numpy(),
        )

    def _draft(self, h0: torch.Tensor, t0: torch.Tensor, k: int, sampling_metadata) -> torch.Tensor:
        """[num_reqs, k >= 1] drafts from h0 [num_reqs, D] and t0 (num_reqs,): a tree's
        first k nodes (a BFS prefix of a tree is a tree), or a chain."""
        if self.trees is not None:
            heads, tables = self.model.heads, self.model.tables
            return propose_tree(heads, h0, t0, self.trees.tree, tables)[:, :k]
        return self._propose_chain(h0, t0, k, sampling_metadata)

    def _propose_chain(
        self, h0: torch.Tensor, t0: torch.Tensor, k: int, sampling_metadata
    ) -> torch.Tensor:
        """[num_reqs, k] drafts, each head step fed the previous draft; with
        draft_sample_method "probabilistic", requests sampled at T > 0 draw theirs from the
        heads' distributions, kept for the rejection sampler (``take_last_draft_probs``)."""
        heads, tables = self.model.heads, self.model.tables
        sampler = self._draft_sampler(sampling_metadata, t0.shape[0])
        drafts = heads.propose(h0, t0, k, tables, self.min_confidence, sampler)
        if sampler is not None:
            vocab_size = self.vllm_config.model_config.get_vocab_size()
            self._last_draft_probs = sampler.target_probs(k, tables.draft_vocab_ids, vocab_size)
            self.draft_log.drawn += sampler.num_drawn
        return drafts

    def _draft_sampler(self, sampling_metadata, num_reqs: int) -> DraftSampler | None:
        """Where drafts are drawn at random: vLLM's own switch (draft_sample_method
        "probabilistic" with the standard rejection sampler) and a request sampled at T > 0
        (seeded ones with their own generator). None: every draft greedy."""
        if not self._enable_probabilistic_draft_probs or sampling_metadata.all_greedy:
            return None
        temperature = sampling_metadata.temperature[:num_reqs]  # (num_reqs,), 0: greedy
        return DraftSampler(temperature, sampling_metadata.generators)

    def _chain_order(self, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's per-token inputs with each accepted tree path moved right after its
        root (``TreeStep.chain_order``), so that what follows reads a chain."""
        step, self.trees.step = self.trees.step, None
        order = None if step is None else step.chain_order(rows[0].shape[0])
        return rows if order is None else tuple(x[order] for x in rows)

    def _augmenting_pass(
        self,
        target_token_ids,
        target_positions,
        target_hidden_states,
        next_token_ids,
        token_indices_to_sample,
        common_attn_metadata,
        num_rejected_tokens_gpu,
        needed: bool,
    ) -> torch.Tensor:
        """The Augmenting Block over every scheduled token, writing its paged KV cache:
        h0 at each request's last accepted token, [num_reqs, hidden_size] (or [0,
        hidden_size] when not `needed`: then the pass only fills the cache). EAGLE's first
        draft pass without the branches Clover never takes (docs/design/drafting.md)."""
        num_tokens, rows, metadata = self.set_inputs_first_pass(
            target_token_ids=target_token_ids,
            next_token_ids=next_token_ids,
            target_positions=target_positions,
            target_hidden_states=self.model.fuse(target_hidden_states),
            token_indices_to_sample=token_indices_to_sample,
            cad=common_attn_metadata,
            num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
        _, per_layer_metadata = self.build_per_group_and_layer_attn_metadata(metadata)
        graph_mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(
            num_tokens
        )
        model_kwargs, num_slots = self.build_model_inputs_first_pass(
            num_tokens, num_input_tokens, None
        )
        if not needed:
            rows = rows[:0]
        with set_forward_context(
            per_layer_metadata,
            self.vllm_config,
            num_tokens=num_input_tokens,
            num_tokens_across_dp=across_dp,
            cudagraph_runtime_mode=graph_mode,
            slot_mapping=self._get_slot_mapping(num_slots, metadata.slot_mapping),
        ):
            h0, _ = self.model(**model_kwargs, rows=rows)
        return h0

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        """Attention groups for the Augmenting Block's layers; none without the block, whose
        kv_cache_gid 0 still gets propose() the target's common attention metadata (why:
        docs/design/drafting.md, "The proposer")."""
        if self._draft_attn_layer_names:
            super().initialize_attn_backend(kv_cache_config, kernel_block_sizes)
            self.may_rest = rest_applies(self.vllm_config)
        else:
            self.kv_cache_gid = 0

    def initialize_cudagraph_keys(self, cudagraph_mode: CUDAGraphMode) -> None:
        """Run the Augmenting Block eagerly and unpadded, whatever the target's graph mode:
        CloverDraftModel is not torch.compile'd, so a PIECEWISE dispatch would only pad the
        batch (docs/design/drafting.md, "The proposer")."""
        super().initialize_cudagraph_keys(CUDAGraphMode.NONE)

    def _maybe_share_embeddings(self, target_language_model: nn.Module) -> None:
        """Clover has no token embedding of its own to share (see _maybe_share_lm_head)."""

    def _maybe_share_lm_head(self, target_language_model: nn.Module) -> None:
        """Attach the target's LM head and input embedding to the heads' tables, checked
        against the ones they were trained for (``target_tables.py``)."""
        attach_target_tables(
            self.model, target_language_model, self.speculative_config.model, self.vllm_config
        )


def _last_accepted(token_indices_to_sample: torch.Tensor | None, common_attn_metadata):
    """[num_reqs] index of each request's last accepted token among the scheduled ones (the
    last scheduled token of each request when the runner gives no indices)."""
    if token_indices_to_sample is not None:
        return token_indices_to_sample
    return common_attn_metadata.query_start_loc[1:] - 1
