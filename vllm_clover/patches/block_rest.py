"""The `block_rest` patch: at a step with nothing to draft, the Augmenting Block rests
(``CloverProposer.idle_step``; docs/design/engine-layer.md, "The resting block")."""

from __future__ import annotations

from vllm_clover.patches.marking import CLOVER_METHOD, patch_attribute


def rest_applies(vllm_config) -> bool:
    """Whether this engine's block may rest: Clover chains whose heads have an Augmenting
    Block, one step in flight at a time (no async scheduling, no batch queue)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.method != CLOVER_METHOD:
        return False
    layers = getattr(spec.draft_model_config.hf_config, "num_augmenting_layers", 0)
    return (
        layers > 0
        and getattr(spec, "speculative_token_tree", None) is None
        and not vllm_config.scheduler_config.async_scheduling
        and vllm_config.max_concurrent_batches == 1
    )


def patch_block_rest() -> None:
    """Wrap the runner's `propose_draft_token_ids`: a Clover drafter may answer a step with
    nothing to draft or write before the runner prepares its inputs."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    @patch_attribute(GPUModelRunner, "propose_draft_token_ids", "block_rest")
    def propose_draft_token_ids(original, self, scheduler_output, *args, **kwargs):
        idle_step = getattr(getattr(self, "drafter", None), "idle_step", None)
        if idle_step is not None:
            drafts = idle_step(
                scheduler_output.num_spec_tokens_to_schedule,
                self.input_batch.num_reqs,
                scheduler_output.total_num_scheduled_tokens,
            )
            if drafts is not None:
                return drafts
        return original(self, scheduler_output, *args, **kwargs)
