"""Patches that let vLLM verify token trees (``speculative_token_tree``) on the V1 runner and
vLLM-CPU's attention; no-ops without a tree. What a tree step does: ``tree/step.py`` and
docs/design.md, "Token trees"."""

from __future__ import annotations

import functools

from vllm_clover.patches.channel import MetadataChannel, RunnerChannel, attach, channel_of
from vllm_clover.patches.marking import is_patched, mark, patch_attribute

# Request parameters whose effect depends on the tokens before each logits row: on a tree
# step a row's history is its own path, which vLLM's samplers cannot be told.
PATH_DEPENDENT = {
    "presence_penalty": lambda p: p.presence_penalty != 0.0,
    "frequency_penalty": lambda p: p.frequency_penalty != 0.0,
    "repetition_penalty": lambda p: p.repetition_penalty != 1.0,
    "bad_words": lambda p: bool(p.bad_words),
    "min_tokens": lambda p: p.min_tokens > 0,
    "logprobs": lambda p: p.logprobs is not None,
    "structured_outputs": lambda p: p.structured_outputs is not None,
    "thinking_token_budget": lambda p: getattr(p, "thinking_token_budget", None) is not None,
}


def patch_tree_steps() -> None:
    """The runner marks each step's tree requests, moves their positions, and verifies them
    with the tree sampler (then compacts their KV)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if is_patched(GPUModelRunner._prepare_inputs, "tree_steps"):
        return
    prepare, build, sample = (
        GPUModelRunner._prepare_inputs,
        GPUModelRunner._build_attention_metadata,
        GPUModelRunner._sample,
    )

    @functools.wraps(prepare)
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = prepare(self, scheduler_output, num_scheduled_tokens)
        trees = _trees(self)
        if trees is not None:
            trees.step = _tree_step(self, trees, result[1])
            if trees.step is not None:
                trees.step.set_positions(self.positions)
        return result

    @functools.wraps(build)
    def _build_attention_metadata(self, *args, **kwargs):
        attn_metadata, common = build(self, *args, **kwargs)
        trees = _trees(self)
        if trees is not None:
            groups = attn_metadata if isinstance(attn_metadata, list) else [attn_metadata]
            for metadata in {id(m): m for g in groups for m in g.values()}.values():
                attach(metadata, MetadataChannel(trees.step))
        return attn_metadata, common

    @functools.wraps(sample)
    def _sample(self, logits, spec_decode_metadata):
        trees = _trees(self)
        if trees is None or trees.step is None:
            return sample(self, logits, spec_decode_metadata)
        return _verify_tree_step(self, trees, logits, spec_decode_metadata)

    GPUModelRunner._prepare_inputs = mark(_prepare_inputs, "tree_steps")
    GPUModelRunner._build_attention_metadata = mark(_build_attention_metadata, "tree_steps")
    GPUModelRunner._sample = mark(_sample, "tree_steps")


def _trees(runner):
    """The runner's TreeVerifier, or None (no Clover engine, or chains)."""
    channel = channel_of(runner, RunnerChannel)
    return None if channel is None else channel.trees


def _tree_step(runner, trees, spec):
    """The step's TreeStep (None without drafts)."""
    from vllm_clover.tree.step import TreeStep

    if spec is None:
        return None
    starts = runner.query_start_loc.np[: runner.input_batch.num_reqs + 1]
    return TreeStep.of(trees.tree, spec.num_draft_tokens, starts)


def _verify_tree_step(runner, trees, logits, spec_decode_metadata):
    """The tree sampler's output for the step (vLLM's SamplerOutput), after settling which
    path each request accepted, compacting the accepted nodes' KV and counting them."""
    from vllm_clover.tree.sampler import verify_trees

    step = trees.step
    output, verdict = verify_trees(
        trees.tree,
        spec_decode_metadata.num_draft_tokens,
        spec_decode_metadata.draft_token_ids,
        logits,
        runner.input_batch.sampling_metadata,
    )
    step.settle(verdict.select(step.requests))
    step.compact()
    trees.record(step.verdict, step.num_nodes)
    return output


def patch_tree_attention() -> None:
    """vLLM-CPU's attention computes a tree step's tree rows with the tree mask; its causal
    kernel runs only for the step's other rows (prefills, requests without drafts)."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    @patch_attribute(CPUAttentionBackendImpl, "forward", "tree_attention")
    def forward(
        original, self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kw
    ):
        channel = channel_of(attn_metadata, MetadataChannel)
        step = None if channel is None else channel.tree
        # output_scale / output_block_scale: fused quantization, which vLLM-CPU refuses
        scales = [*args, kw.get("output_scale"), kw.get("output_block_scale")]
        if (
            step is None
            or self.attn_type != AttentionType.DECODER
            or any(scale is not None for scale in scales)
        ):
            return original(
                self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kw
            )
        if not step.covers(attn_metadata.num_actual_tokens):
            original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kw)
        step.attend(self, layer, query, kv_cache, attn_metadata, output)
        return output


def patch_tree_requests() -> None:
    """A tree engine refuses, per request, the parameters it cannot apply along a path."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    @patch_attribute(SamplingParams, "_validate_spec_decode", "tree_requests")
    def _validate_spec_decode(original, self, speculative_config) -> None:
        original(self, speculative_config)
        if getattr(speculative_config, "speculative_token_tree", None) is None:
            return
        refused = [name for name, used in PATH_DEPENDENT.items() if used(self)]
        if refused:
            raise VLLMValidationError(
                f"{', '.join(refused)} cannot be used with speculative_token_tree yet (each "
                "draft node has a history of its own); serve without a tree for these requests",
                parameter=refused[0],
            )
