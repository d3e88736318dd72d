"""Patches for vLLM 0.32 behaviour that is not Clover's but that its users meet (see the
ledger). Why each: docs/design/engine-layer.md, "Fixes of vLLM behaviour that is not Clover's".
"""

from __future__ import annotations

import functools

from vllm_clover.patches.marking import is_patched, mark, patch_attribute


# --------------------------------------------------------------------------- cpu_float_expand
def _torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), any dtype
    (worked example: docs/design/engine-layer.md, "Fixes of vLLM behaviour")."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    expanded = values.repeat_interleave(counts)
    output[: expanded.numel()].copy_(expanded)


def patch_cpu_float_expand() -> None:
    import torch
    from vllm.utils import cpu_triton_utils

    @patch_attribute(cpu_triton_utils, "_expand_kernel_impl", "cpu_float_expand")
    def _expand_kernel_impl(
        original, output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None
    ) -> None:
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return original(
                output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS
            )
        return _torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to)


# --------------------------------------------------------------------------- medusa_token_map
def patch_medusa_token_map() -> None:
    """Report Medusa's `token_map` as loaded, so heads with a draft vocabulary load (vLLM's
    strict loader otherwise refuses them; our Medusa baseline needs it)."""
    from vllm.model_executor.models.medusa import Medusa

    @patch_attribute(Medusa, "load_weights", "medusa_token_map")
    def load_weights(original, self, weights) -> set[str]:
        loaded = original(self, weights)
        if getattr(self, "token_map", None) is not None:
            loaded.add("token_map")
        return loaded


# --------------------------------------------------------------------------- http_shutdown_grace
HTTP_SHUTDOWN_GRACE_S = 2.0


def patch_http_shutdown_grace() -> None:
    """Give vLLM's API server a bounded HTTP shutdown once its engine has stopped: uvicorn
    cancels the streams left open after HTTP_SHUTDOWN_GRACE_S instead of waiting for their
    clients without limit."""
    from vllm.entrypoints.launchers.api_server import entry

    original = entry.serve_http
    if is_patched(original, "http_shutdown_grace"):
        return

    @functools.wraps(original)
    async def serve_http(*args, **uvicorn_kwargs):
        uvicorn_kwargs.setdefault("timeout_graceful_shutdown", HTTP_SHUTDOWN_GRACE_S)
        return await original(*args, **uvicorn_kwargs)

    entry.serve_http = mark(serve_http, "http_shutdown_grace")


# --------------------------------------------------------------------------- zero_draft_sampling
def patch_zero_draft_sampling() -> None:
    """Sample a step in which no request has a draft token with vLLM's plain sampler (the
    rejection sampler's output there is each request's bonus token anyway, at the price of
    two logits copies). The original path stays with logprobs, spec tokens or async
    scheduling."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    @patch_attribute(GPUModelRunner, "_sample", "zero_draft_sampling")
    def _sample(original, self, logits, spec_decode_metadata):
        if (
            spec_decode_metadata is not None
            and not self.use_async_scheduling
            and bonus_tokens_only(spec_decode_metadata, self.input_batch.sampling_metadata)
        ):
            spec_decode_metadata = None  # the plain sampler, as without speculation
        return original(self, logits, spec_decode_metadata)


def bonus_tokens_only(spec_decode_metadata, sampling_metadata) -> bool:
    """True when a speculative step samples nothing but bonus tokens, without logprobs."""
    return (
        spec_decode_metadata.max_spec_len == 0
        and sampling_metadata.max_num_logprobs is None
        and not sampling_metadata.logprob_token_ids
        and not any(sampling_metadata.spec_token_ids or ())
    )


# --------------------------------------------------------------------------- cpu_recovered_tokens
def patch_cpu_recovered_tokens() -> None:
    """Draw the rejection sampler's recovered tokens by inverse CDF on the CPU platform:
    `residual_tokens` draws the same distribution, max(p - q, 0) normalised, with one
    uniform per draft position instead of a vocabulary of exponential noise."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler

    from vllm_clover.modeling.draft_sampling import residual_tokens

    @patch_attribute(rejection_sampler, "sample_recovered_tokens", "cpu_recovered_tokens")
    def sample_recovered_tokens(
        _original,  # its noise is what this patch replaces
        max_spec_len,
        num_draft_tokens,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        sampling_metadata,
        device,
        use_fp64_gumbel=False,
    ):
        generators = sampling_metadata.generators
        return residual_tokens(
            target_probs, draft_probs, draft_token_ids, num_draft_tokens, generators
        )


# --------------------------------------------------------------------------- cpu_bf16_gemm
def patch_cpu_bf16_gemm() -> None:
    """bf16 linear layers on the plugin's AVX2 GEMM where oneDNN has no bf16 matmul (vLLM's
    ``F.linear`` fallback reads the weight once per row of x; ``cpu/gemm.py``)."""
    from vllm.model_executor.layers import utils

    from vllm_clover.cpu.gemm import dispatch_bf16

    @patch_attribute(utils, "dispatch_cpu_unquantized_gemm", "cpu_bf16_gemm")
    def dispatch_cpu_unquantized_gemm(original, layer, remove_weight: bool) -> None:
        if not dispatch_bf16(layer):  # keeps the weight, as vLLM's own fallback does
            original(layer, remove_weight)
