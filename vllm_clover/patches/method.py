"""The patches that make "clover" a speculative method of vLLM 0.32 (see the ledger): each
opens one closed door (the method `Literal`, the runner's proposer choice, the EAGLE-only
paths), and nothing else. How: docs/design/engine-layer.md, "The method patches"."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Literal

from vllm.logger import init_logger

from vllm_clover.patches.channel import RunnerChannel, attach
from vllm_clover.patches.marking import CLOVER_METHOD, is_patched, mark, patch_attribute

logger = init_logger("vllm.clover.patches")


# --------------------------------------------------------------------------- method_literal
def patch_method_literal() -> None:
    """`SpeculativeConfig.method: Literal[..., "clover"] | None` (pydantic validates it)."""
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative
    from vllm.engine import arg_utils

    config_class = speculative.SpeculativeConfig
    if is_patched(config_class, "method_literal"):
        return
    widened = Literal[speculative.SpeculativeMethod, CLOVER_METHOD] | None
    config_class.__dataclass_fields__["method"].type = widened
    config_class.__annotations__["method"] = widened
    rebuild_dataclass(config_class, force=True)
    arg_utils._compute_kwargs.cache_clear()  # `--spec-method` choices are cached per class
    mark(config_class, "method_literal")


# --------------------------------------------------------------------------- clover_fields
# Clover's own `speculative_config` keys: name -> (type, default); without them the closed
# pydantic SpeculativeConfig refuses them as unexpected keywords.
CLOVER_FIELDS: dict[str, tuple[object, object]] = {
    "draft_confidence": (float | list[float] | None, None),
    "draft_budget": (Literal["goodput", "fixed"] | None, None),
    "speculative_token_tree": (str | None, None),  # vLLM's CLI derives flags from these types
    "lookup": (bool | dict[str, int] | None, None),  # hybrid drafting (hybrid/drafter.py)
}


def patch_clover_fields() -> None:
    """Add CLOVER_FIELDS to SpeculativeConfig (validated by pydantic like its own fields)."""
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative

    config_class = speculative.SpeculativeConfig
    if is_patched(config_class, "clover_fields"):
        return
    for name, (annotation, default) in CLOVER_FIELDS.items():
        _set_field(config_class, name, annotation, default)
    rebuild_dataclass(config_class, force=True)
    mark(config_class, "clover_fields")


def _set_field(config_class, name: str, annotation, default, metadata=None) -> None:
    """Make `name` a dataclass field of `config_class` (added, or its type and default
    replaced); the caller rebuilds the pydantic dataclass afterwards."""
    import dataclasses

    spec_field = dataclasses.field(default=default, metadata=metadata)
    spec_field.name, spec_field.type = name, annotation
    spec_field._field_type = dataclasses._FIELD  # what @dataclass sets on its own fields
    config_class.__dataclass_fields__[name] = spec_field
    config_class.__annotations__[name] = annotation
    setattr(config_class, name, default)


# --------------------------------------------------------------------------- draft_sample_default
VLLM_DEFAULT = "vllm_clover.vllm_default"  # field metadata key: vLLM's own default, kept


def patch_draft_sample_default() -> None:
    """`SpeculativeConfig.draft_sample_method: DraftSampleMethod | None = None`, with vLLM's
    default ("greedy") kept in the field's metadata, so that `post_init` can tell a user's
    "greedy" from no setting (docs/design/engine-layer.md, "The method patches")."""
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative

    config_class = speculative.SpeculativeConfig
    current = config_class.__dataclass_fields__["draft_sample_method"]
    if VLLM_DEFAULT in current.metadata:
        return
    widened = speculative.DraftSampleMethod | None
    metadata = {VLLM_DEFAULT: current.default}
    _set_field(config_class, "draft_sample_method", widened, None, metadata)
    rebuild_dataclass(config_class, force=True)


def vllm_draft_sample_default(config_class) -> str:
    """vLLM's own default of draft_sample_method, as the patch above found it."""
    return config_class.__dataclass_fields__["draft_sample_method"].metadata[VLLM_DEFAULT]


# --------------------------------------------------------------------------- post_init
def _clover_post_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __post_init__(self) -> None:
        from vllm_clover.core.checks import is_clover_checkpoint

        if self.method is None and is_clover_checkpoint(self.model):
            self.method = CLOVER_METHOD  # detected from the checkpoint's model_type
        if self.method != CLOVER_METHOD:
            _check_not_clover(self)
            return original(self)
        config = _resolve_clover_settings(self)
        _keep_last_prefix_block(self, config)
        # vLLM builds the draft ModelConfig (dtype, max_model_len, parallelism) for a
        # generic draft model; Clover needs exactly that, under its own name afterwards.
        self.method = "draft_model"
        try:
            original(self)
        finally:
            self.method = CLOVER_METHOD

    return mark(__post_init__, "post_init")


def _check_not_clover(spec) -> None:
    """Another method: Clover's own keys are refused, vLLM's draft_sample_method default
    restored (the draft_sample_default patch left it None)."""
    from vllm_clover.core.checks import CloverStartupError

    given = [name for name in CLOVER_FIELDS if getattr(spec, name) is not None]
    if given:
        raise CloverStartupError(
            f"speculative_config {given} apply to method 'clover' only, not {spec.method!r}"
        )
    if spec.draft_sample_method is None:
        spec.draft_sample_method = vllm_draft_sample_default(type(spec))


def _resolve_clover_settings(spec):
    """Check the checkpoint against the target and fill in every Clover setting the user
    left out (K, draft sampling, confidence, budget, or the tree); the checkpoint's
    CloverConfig. CloverStartupError, one line naming the problem, on a bad setting."""
    from vllm import envs

    from vllm_clover.core.checks import (
        CloverStartupError,
        check_clover_spec,
        check_draft_sampling,
        check_target_serves_layers,
        resolve_draft_budget,
        resolve_draft_confidence,
        resolve_draft_sampling,
        resolve_token_tree,
    )

    if envs.VLLM_USE_V2_MODEL_RUNNER:  # vLLM reads it as bool(int(value))
        raise CloverStartupError(
            "Clover runs on vLLM's V1 model runner; unset "
            "VLLM_USE_V2_MODEL_RUNNER=1 to use speculative method 'clover'"
        )
    tree = spec.speculative_token_tree is not None
    try:
        config = check_clover_spec(
            spec.model,
            None if tree else spec.num_speculative_tokens,
            spec.target_model_config.hf_config,
        )
        check_target_serves_layers(config, spec.model, spec.target_model_config)
        spec.draft_sample_method = resolve_draft_sampling(spec)
        check_draft_sampling(spec)
        _check_lookup(spec, tree)
        if tree:
            resolve_token_tree(spec, config)
        else:
            if spec.num_speculative_tokens is None:
                spec.num_speculative_tokens = config.num_heads
            spec.draft_confidence = resolve_draft_confidence(spec.draft_confidence, config)
            spec.draft_budget = resolve_draft_budget(
                spec.draft_budget, spec.num_speculative_tokens_per_batch_size
            )
    except ValueError as err:  # a bad checkpoint or setting: one line, not pydantic's report
        raise CloverStartupError(str(err)) from None
    return config


def _check_lookup(spec, tree: bool) -> None:
    """ValueError for a malformed "lookup", or one asked for with a token tree."""
    from vllm_clover.hybrid.drafter import LookupConfig

    if LookupConfig.of(spec.lookup) is not None and tree:
        raise ValueError(
            '"lookup" drafts chains; it cannot be combined with speculative_token_tree yet'
        )


def _keep_last_prefix_block(spec, config) -> None:
    """Turn vLLM's EAGLE block drop off for every Clover engine: heads that read H alone keep
    a hit's last block, heads with the next-token fusion give it up only where the
    prefix_block_drop patch says (docs/design/engine-layer.md, "The method patches")."""
    if spec.disable_eagle_block_drop:
        return
    spec.disable_eagle_block_drop = True
    logger.info(
        "Clover: the last prefix-cache block a request hits is kept%s (vLLM's warning that "
        "EAGLE block dropping is disabled does not apply to Clover heads)",
        " where the token after it is the one its draft KV was computed with"
        if config.fuse_next_token
        else ": these heads read the target's hidden states alone",
    )


def patch_post_init() -> None:
    from vllm.config.speculative import SpeculativeConfig

    if not is_patched(SpeculativeConfig.__post_init__, "post_init"):
        SpeculativeConfig.__post_init__ = _clover_post_init(SpeculativeConfig.__post_init__)


# --------------------------------------------------------------------------- use_eagle
def patch_use_eagle() -> None:
    """`use_eagle()` drives the draft KV cache, lookahead slots and the EAGLE code path."""
    from vllm.config.speculative import SpeculativeConfig

    @patch_attribute(SpeculativeConfig, "use_eagle", "use_eagle")
    def use_eagle(original, self) -> bool:
        return self.method == CLOVER_METHOD or original(self)


# --------------------------------------------------------------------------- runner_drafter
def patch_runner_drafter() -> None:
    """Replace the EagleProposer the runner builds for a Clover config by a CloverProposer.

    Also covers the CPU runner, whose __init__ calls this one.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    @patch_attribute(GPUModelRunner, "__init__", "runner_drafter")
    def __init__(original, self, vllm_config, device, *args, **kwargs) -> None:
        original(self, vllm_config, device, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is not None and spec.method == CLOVER_METHOD and hasattr(self, "drafter"):
            from vllm_clover.core.proposer import CloverProposer
            from vllm_clover.tree.step import TreeVerifier

            attach(self, RunnerChannel(TreeVerifier.of(vllm_config)))  # None unless a tree
            self.drafter = CloverProposer(vllm_config, device, self)
            request_target_layers(self, spec.draft_model_config.hf_config)
            logger.info(
                "Clover: drafting with CloverProposer on the V1 model runner (%s)",
                type(self).__name__,
            )


def request_target_layers(runner, config) -> None:
    """Heads with ``target_layers``: ask the target for those layers as EAGLE-3 does (vLLM's
    load_model sets them on the target; the target_signal patch hands them over after H)."""
    if not getattr(config, "target_layers", None):
        return
    config.eagle_aux_hidden_state_layer_ids = tuple(config.target_layers)
    runner.use_aux_hidden_state_outputs = True


# --------------------------------------------------------------------------- target_signal
def patch_target_signal() -> None:
    """Give Clover heads with target layers the signal [H | L_a ...], not the layers alone:
    H goes at the head of vLLM's aux list, so every row selection applies to both."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    signature = inspect.signature(GPUModelRunner.propose_draft_token_ids)

    @patch_attribute(GPUModelRunner, "propose_draft_token_ids", "target_signal")
    def propose_draft_token_ids(original, self, *args, **kwargs):
        if not getattr(getattr(self, "drafter", None), "reads_target_layers", False):
            return original(self, *args, **kwargs)  # every other drafter: untouched, no binding
        bound = signature.bind(self, *args, **kwargs)
        aux = bound.arguments.get("aux_hidden_states")
        if aux is not None:
            bound.arguments["aux_hidden_states"] = [bound.arguments["hidden_states"], *aux]
        return original(*bound.args, **bound.kwargs)


# --------------------------------------------------------------------------- v1_runner_only
def patch_v1_runner_only() -> None:
    """List Clover as unsupported by the V2 runner, as vLLM does for medusa/custom_class."""
    from vllm.config.vllm import VllmConfig

    @patch_attribute(VllmConfig, "_get_v2_model_runner_unsupported_features", "v1_runner_only")
    def unsupported_features(original, self) -> list[str]:
        features = original(self)
        if self.speculative_config is not None and self.speculative_config.method == CLOVER_METHOD:
            features.append(f"speculative method '{CLOVER_METHOD}'")
        return features


# --------------------------------------------------------------------------- async_scheduling
def patch_async_scheduling() -> None:
    """Count Clover among the EAGLE-style methods `VllmConfig` allows async scheduling for
    (rebinds `EagleModelTypes`, read by name in `vllm/config/vllm.py` only for that check)."""
    from typing import get_args

    from vllm.config import vllm as config_module

    eagle_types = config_module.EagleModelTypes
    if CLOVER_METHOD not in get_args(eagle_types):
        config_module.EagleModelTypes = Literal[eagle_types, CLOVER_METHOD]


# --------------------------------------------------------------------------- draft_lengths
def patch_draft_lengths() -> None:
    """Cut each request's Clover draft at its first -1 before the scheduler sees it: a row
    [12, 7, -1, -1] becomes [12, 7]. Not under async scheduling, where the proposer never
    stops early (docs/design/engine-layer.md, "The method patches")."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    @patch_attribute(GPUModelRunner, "take_draft_token_ids", "draft_lengths")
    def take_draft_token_ids(original, self):
        drafts = original(self)
        drafter = getattr(self, "drafter", None)
        if drafts is not None and getattr(drafter, "stops_early", False):
            for row in drafts.draft_token_ids:
                if -1 in row:
                    del row[row.index(-1) :]
        return drafts
