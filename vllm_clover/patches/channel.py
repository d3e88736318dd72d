"""The plugin's one typed channel on vLLM's objects (ledger entry `clover_channel`): one
dataclass per vLLM object, under the attribute ``CHANNEL``, read back with ``channel_of``.
How it works: docs/design/engine-layer.md, "The typed channel"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from vllm_clover.budget.goodput import GoodputController
    from vllm_clover.tree.step import TreeStep, TreeVerifier

CHANNEL = "clover"  # the attribute name, on vLLM's Scheduler, model runner, attention metadata
T = TypeVar("T")


@dataclass
class SchedulerChannel:
    """Beside a Clover engine's Scheduler: the budget that picks each step's K (None: vLLM's
    K)."""

    budget: GoodputController | None = None
    step_started: float = 0.0  # perf_counter() when the step's schedule() began


@dataclass
class RunnerChannel:
    """Beside a Clover engine's model runner: its token-tree verifier (None: chains)."""

    trees: TreeVerifier | None


@dataclass
class MetadataChannel:
    """Beside a tree step's attention metadata: the step's tree layout (None: no tree)."""

    tree: TreeStep | None


def attach(obj: Any, channel: T) -> T:
    """Attach `channel` to the vLLM object `obj`; returns it."""
    setattr(obj, CHANNEL, channel)
    return channel


def scheduler_channel(scheduler: Any) -> SchedulerChannel:
    """The scheduler's SchedulerChannel, attached first if it has none (two patches fill it)."""
    return channel_of(scheduler, SchedulerChannel) or attach(scheduler, SchedulerChannel())


def channel_of(obj: Any, kind: type[T]) -> T | None:
    """The channel of type `kind` attached to `obj`, or None (none, or another kind)."""
    value = getattr(obj, CHANNEL, None)
    return value if isinstance(value, kind) else None
