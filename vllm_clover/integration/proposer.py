"""`CloverProposer`: Clover drafting inside vLLM 0.32's V1 model runner.

One step of speculative decoding, for a batch of requests (vLLM verifies, we only draft):

    target forward over the scheduled tokens  -> H [num_tokens, D], and the runner
                                                 samples/accepts -> t0 per request
    Augmenting Block over H (paged KV cache)  -> h0 at each request's last accepted token
    K head steps, no KV cache:  h_i = step_i(h_{i-1}, emb(x_i)),  x_{i+1} = argmax logits_i
    return drafts [num_reqs, K]               -> vLLM's rejection sampler verifies them

The first two lines are exactly what vLLM's EAGLE proposer does with its draft model, so
`CloverProposer` is an `EagleProposer` (the runner's EAGLE code paths, KV-cache allocation,
prefix caching, chunked prefill and preemption handling all apply) whose per-token draft
forwards are replaced by the head loop: we ask the base class for one draft, and produce
the whole chain where it samples that one (`_sample_draft_tokens`).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import CUDAGraphMode
from vllm.distributed import tensor_model_parallel_all_gather
from vllm.logger import init_logger
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_clover.integration.checks import DRAFT_DTYPE_ENV, draft_dtype_setting
from vllm_clover.integration.model import scoring_dtype
from vllm_clover.modeling.checkpoint import CloverCheckpointError, check_target_fits
from vllm_clover.modeling.vocab_parallel import VocabParallelCloverHeads

logger = init_logger("vllm.clover.proposer")


class CloverProposer(EagleProposer):
    def __init__(self, vllm_config, device: torch.device, runner=None) -> None:
        super().__init__(vllm_config, device, runner)
        # Set by propose() for the one _sample_draft_tokens() call the base class makes.
        self._chain_length = 0  # K of this step
        self._chain_start: torch.Tensor | None = None  # [num_reqs] t0 per request

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
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu: torch.Tensor | None = None,
        slot_mappings=None,
    ) -> torch.Tensor:
        """Draft a chain of `num_speculative_tokens` per request: [num_reqs, K] int64.

        K may change from step to step (dynamic speculation) and may be 0, in which case
        the Augmenting Block still runs so its KV cache stays in sync.
        """
        if not self.model.layers:  # no Augmenting Block: h0 = H, no draft forward at all
            rows = (common_attn_metadata.query_start_loc[1:] - 1
                    if token_indices_to_sample is None else token_indices_to_sample)
            return self._draft_from_target(num_speculative_tokens, target_hidden_states[rows],
                                           next_token_ids)
        self._chain_length = num_speculative_tokens
        self._chain_start = next_token_ids
        drafts = super().propose(
            min(num_speculative_tokens, 1), target_token_ids, target_positions,
            target_hidden_states, next_token_ids, token_indices_to_sample,
            common_attn_metadata, sampling_metadata, mm_embed_inputs,
            num_rejected_tokens_gpu, slot_mappings,
        )
        self.num_speculative_tokens = num_speculative_tokens
        if num_speculative_tokens == 0:
            return drafts  # [num_reqs, 0]: the Augmenting Block ran, nothing to draft
        return drafts.reshape(-1, num_speculative_tokens)  # [num_reqs * K, 1] -> [num_reqs, K]

    def _draft_from_target(
        self,
        num_speculative_tokens: int,
        # [num_reqs, hidden_size]: H at each request's last accepted token
        hidden_states: torch.Tensor,
        # [num_reqs]: t0
        next_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        """The head loop straight on the target's hidden states: [num_reqs, K] int64.

        What the base class's draft pass reduces to when there is no Augmenting Block (its
        draft model would be the identity): no draft KV cache, no attention metadata.
        """
        self.num_speculative_tokens = num_speculative_tokens
        self._last_draft_probs = None  # greedy drafts: vLLM treats them as one-hot
        if num_speculative_tokens == 0:
            return next_token_ids.new_empty((next_token_ids.shape[0], 0), dtype=torch.int64)
        return self.model.heads.propose(hidden_states, next_token_ids.long(),
                                        num_speculative_tokens)

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        """Attention groups for the Augmenting Block's layers; none without the block.

        vLLM asserts that a drafter's attention layers share one KV-cache group, which a
        drafter without any fails. Pointing kv_cache_gid at group 0 makes the runner hand
        propose() the target's common attention metadata (its query_start_loc finds each
        request's last token); nothing else reads it for a drafter without layers.
        """
        if self._draft_attn_layer_names:
            super().initialize_attn_backend(kv_cache_config, kernel_block_sizes)
        else:
            self.kv_cache_gid = 0

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata):
        """The head loop, where the base class would sample one draft.

        hidden_states: [num_reqs, hidden_size], h0 at each request's last accepted token.
        Returns ([num_reqs * K] draft ids, None); None = drafts are the heads' argmax,
        which vLLM's rejection sampler treats as one-hot (exact at any temperature).
        """
        heads = self.model.heads
        drafts = heads.propose(hidden_states, self._chain_start.long(), self._chain_length)
        return drafts.reshape(-1), None

    def initialize_cudagraph_keys(self, cudagraph_mode: CUDAGraphMode) -> None:
        """Run the Augmenting Block eagerly and unpadded, whatever the target's graph mode.

        vLLM's drafter graphs are the piecewise pieces of a torch.compile'd draft model;
        CloverDraftModel is not compiled, so a PIECEWISE dispatch would only pad the batch
        to a capture size (and, with VLLM_USE_BREAKABLE_CUDAGRAPH=1, stream-capture the
        block). The head loop runs after the model call and is never captured (docs/gpu.md).
        """
        super().initialize_cudagraph_keys(CUDAGraphMode.NONE)

    def _maybe_share_embeddings(self, target_language_model: nn.Module) -> None:
        """Clover has no token embedding of its own to share (see _maybe_share_lm_head)."""

    def _maybe_share_lm_head(self, target_language_model: nn.Module) -> None:
        """Attach the target's LM head (and input embedding) to the heads, after checking
        that they are the ones the heads were trained for (shape and fingerprint).

        Under tensor parallelism each rank attaches its own rows (no copy); the full LM
        head is gathered once, here, for the fingerprint check only.
        """
        config = self.model.config
        heads = self.model.heads
        lm_head, embedding = _target_tables(target_language_model, config)
        if isinstance(heads, VocabParallelCloverHeads):
            full_lm_head = tensor_model_parallel_all_gather(lm_head.weight, dim=0)
            full_embedding = None if embedding is None else tensor_model_parallel_all_gather(
                embedding.weight, dim=0)[: config.vocab_size]
            self._check_fits(full_lm_head[: config.vocab_size], full_embedding)
            del full_lm_head, full_embedding
        else:
            self._check_fits(lm_head.weight[: config.vocab_size],
                             None if embedding is None else embedding.weight[: config.vocab_size])
        setting = draft_dtype_setting()
        heads.scoring_dtype = scoring_dtype(lm_head.weight.dtype, lm_head.weight.device, setting)
        logger.info("Clover: draft rows scored in %s, head network and target in %s (%s=%s)",
                    heads.scoring_dtype, lm_head.weight.dtype, DRAFT_DTYPE_ENV, setting)
        if isinstance(heads, VocabParallelCloverHeads):
            shard = lm_head.shard_indices  # this rank's real ids, vLLM's padding dropped
            rows = slice(0, shard.num_org_elements)
            heads.attach_shard(lm_head.weight[rows], shard.org_vocab_start_index,
                               None if embedding is None else embedding.weight[rows])
        else:
            heads.attach_target(lm_head.weight[: config.vocab_size],
                                None if embedding is None else
                                embedding.weight[: config.vocab_size])

    def _check_fits(self, lm_head: torch.Tensor, embedding: torch.Tensor | None) -> None:
        path = self.speculative_config.model
        try:
            # A served path never equals the recorded target name: the fingerprint decides.
            check_target_fits(self.model.config, path, lm_head, embedding)
        except CloverCheckpointError:
            logger.error("Clover checkpoint %s does not fit target %s", path,
                         self.vllm_config.model_config.model)
            raise


def _target_tables(target_language_model: nn.Module, config) -> tuple[nn.Module, nn.Module | None]:
    """The target's LM head layer and, if the heads read it, its input-embedding layer."""
    embedding = target_language_model.model.embed_tokens if config.needs_input_embedding else None
    return target_language_model.lm_head, embedding
