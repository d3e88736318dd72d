"""The plugin's one typed channel on vLLM's objects (ledger entry `clover_channel`).

A Clover engine keeps state beside vLLM's own: the draft budget beside the scheduler, the
token-tree verifier beside the model runner, a tree step's layout beside the attention
metadata that carries it to the attention backend. Each is one dataclass below, attached to
the vLLM object under the one attribute name ``CHANNEL``; the patches read it back with
``channel_of``. Nothing else of the plugin's is set on vLLM's objects (a test checks it).

Example: the goodput patch does ``scheduler_channel(scheduler).budget = budget``; later
``channel_of(scheduler, SchedulerChannel).budget`` is that controller, and
``channel_of(scheduler, RunnerChannel)`` is None.
"""

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
