"""The patches that make "clover" a speculative method of vLLM 0.32 (see the ledger).

vLLM 0.32 has no registry for speculative methods: the method is a closed `Literal`, the
proposer is picked by an if/elif in the model runner, and "uses the target's hidden states
and a draft KV cache" is hard-wired to EAGLE-like methods. Each patch here opens one of those
doors, and nothing else.
"""

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
# Clover's own `speculative_config` keys: name -> (type, default). vLLM 0.32's SpeculativeConfig
# is a closed pydantic dataclass, so `speculative_config={"draft_confidence": ...}` would be
# refused as an unexpected keyword without them.
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
    default ("greedy") kept in the field's metadata. vLLM gives every method "greedy" when
    the key is absent, so a user's "greedy" could not be told from no setting; with None for
    "not given", `post_init` resolves it: Clover's chains draw their drafts
    (`checks.resolve_draft_sampling`), every other method gets vLLM's default back."""
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
    """On a prefix-cache hit vLLM recomputes the last cached block for EAGLE-like drafters,
    whose draft KV at the block's last slot was computed with the token that followed it
    then. Heads that read H alone (no Augmenting Block, or one without the next-token fusion)
    have draft KV that the prefix fixes, like the target's: they keep that block. Heads with
    the fusion give it up only where the token after the hit differs (the prefix_block_drop
    patch, ``prefix_blocks.py``), so vLLM's drop is off for every Clover engine."""
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
    """Heads with ``target_layers``: ask the target for those layers as EAGLE-3 does. vLLM's
    load_model then sets them on the target (``_setup_eagle3_aux_hidden_state_outputs``, which
    reads ``eagle_aux_hidden_state_layer_ids`` from the draft config), and the target_signal
    patch hands them to the proposer after H."""
    if not getattr(config, "target_layers", None):
        return
    config.eagle_aux_hidden_state_layer_ids = tuple(config.target_layers)
    runner.use_aux_hidden_state_outputs = True


# --------------------------------------------------------------------------- target_signal
def patch_target_signal() -> None:
    """Give Clover heads with target layers the signal [H | L_a ...], not the layers alone.

    With aux outputs on, vLLM hands a drafter ``torch.cat(aux_hidden_states)`` in place of H
    (EAGLE-3 reads the layers only); Clover reads H first. Putting H at the head of the list
    lets every row selection vLLM makes apply to H and the layers alike.
    """
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


# --------------------------------------------------------------------------- draft_lengths
def patch_draft_lengths() -> None:
    """Cut each request's Clover draft at its first -1 before the scheduler sees it.

    The proposer returns [num_reqs, K] with -1 after a request's confidence stop
    (`HeadLoop.propose`) or a lookup chain shorter than K; vLLM's scheduler takes
    per-request draft lists of any length (ngram relies on it), so a row [12, 7, -1, -1]
    becomes [12, 7] and that request verifies two drafts next step. Under async scheduling
    the runner reads the on-device draft tensor instead, so the proposer never stops early
    there (see `CloverProposer`).
    """
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
