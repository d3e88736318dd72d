"""One timed generation on a vLLM engine and the speculative-decoding counters around it
(differences of snapshots of vLLM's cumulative counters), for `demo` and `bench`. How it
works: docs/design/engine-layer.md, "Counters"."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import LLM

SPEC_PREFIX = "vllm:spec_decode_"
# One observation per engine step that produced output (prefill, decode or mixed).
STEP_HISTOGRAM = "vllm:iteration_tokens_total"


@dataclass(frozen=True)
class Counters:
    """Engine counters: speculative decoding, engine steps and drafting time."""

    drafts: int = 0  # verification steps that carried drafts (one per request per step)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    steps: int = 0
    drafting_seconds: float = 0.0
    drafting_calls: int = 0
    lookup_verified: int = 0  # draft tokens of the prompt lookup's chains ("lookup")
    lookup_accepted: int = 0
    lookup_only_steps: int = 0  # steps drafted from the lookup alone (no head loop)

    def __sub__(self, before: Counters) -> Counters:
        """The counts between the snapshot `before` and this one."""
        values = {
            f.name: getattr(self, f.name) - getattr(before, f.name)
            for f in fields(self)
            if f.name != "accepted_per_pos"
        }
        size = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        after_pos, before_pos = (
            _pad(p, size) for p in (self.accepted_per_pos, before.accepted_per_pos)
        )
        per_pos = tuple(a - b for a, b in zip(after_pos, before_pos, strict=True))
        return Counters(**values, accepted_per_pos=per_pos)

    @property
    def tau(self) -> float | None:
        """Mean tokens per verification step: 1 + accepted / drafts (the bonus token incl.)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def acceptance_rates(self) -> list[float]:
        """Per draft position i: the share of drafts whose first i+1 tokens were accepted."""
        return [n / self.drafts for n in self.accepted_per_pos] if self.drafts else []


def _pad(values: tuple[int, ...], size: int) -> tuple[int, ...]:
    return tuple(values) + (0,) * (size - len(values))


@dataclass
class Run:
    """One timed generation: token ids per prompt, wall seconds, counter deltas (and the
    detokenized answers, where the caller reads them)."""

    tokens: list[list[int]]
    seconds: float
    counters: Counters
    texts: list[str] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        """Generated tokens over all prompts."""
        return sum(map(len, self.tokens))

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per wall second of the timed call."""
        return self.output_tokens / self.seconds

    @property
    def seconds_per_step(self) -> float | None:
        """Wall seconds per engine step (None if no step was counted)."""
        return self.seconds / self.counters.steps if self.counters.steps else None


def identical_outputs(reference: list[list[int]], other: list[list[int]]) -> int:
    """How many prompts have exactly the same token ids in both runs."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} vs {len(other)} outputs: not the same prompts")
    return sum(a == b for a, b in zip(reference, other, strict=True))


def counters_from_metrics(
    metrics: Iterable[Any], drafting: tuple[float, int] = (0.0, 0)
) -> Counters:
    """Counters from `LLM.get_metrics()` objects (summed over label sets, e.g. engines)."""
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_pos: tuple[int, ...] = ()
    steps = 0
    for metric in metrics:
        name = metric.name
        if name == STEP_HISTOGRAM:
            steps += metric.count
        elif name == SPEC_PREFIX + "num_accepted_tokens_per_pos":
            size = max(len(per_pos), len(metric.values))
            per_pos = tuple(
                a + b for a, b in zip(_pad(per_pos, size), _pad(metric.values, size), strict=True)
            )
        elif name.removeprefix(SPEC_PREFIX) in totals:
            totals[name.removeprefix(SPEC_PREFIX)] += metric.value
    return Counters(
        totals["num_drafts"],
        totals["num_draft_tokens"],
        totals["num_accepted_tokens"],
        per_pos,
        steps,
        *drafting,
    )


def metric_total(llm: LLM, name: str) -> float:
    """The sum of `llm`'s counter or gauge `name` over its label sets (e.g. engines), such as
    "vllm:num_preemptions" or "vllm:prompt_tokens_cached"."""
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


def install_drafting_timer(llm: LLM) -> None:
    """Make `read_counters` include the time spent drafting (`patches/hooks.py`)."""
    from vllm_clover.patches.hooks import DRAFTING, time_methods

    llm.collective_rpc(time_methods, args=((DRAFTING,),))


def read_counters(llm: LLM) -> Counters:
    """A snapshot of the engine's cumulative counters (drafting time and the lookup's counts
    summed over workers)."""
    from vllm_clover.hybrid.drafter import lookup_counts
    from vllm_clover.patches.hooks import DRAFTING, method_times

    timers = [t.get(DRAFTING, (0.0, 0)) for t in llm.collective_rpc(method_times)]
    drafting = (sum(t[0] for t in timers), sum(t[1] for t in timers))
    counters = counters_from_metrics(llm.get_metrics(), drafting)
    lookup = llm.collective_rpc(lookup_counts)[0]  # the first worker's: every rank drafts alike
    verified, accepted, lookup_only = lookup
    return replace(
        counters,
        lookup_verified=verified,
        lookup_accepted=accepted,
        lookup_only_steps=lookup_only,
    )


def timed_chat(llm: LLM, chats: list, params: Any) -> Run:
    """`llm.chat(chats, params)`, timed, with the counters it moved."""
    return timed_run(llm, lambda: llm.chat(chats, params, use_tqdm=False))


def timed_run(llm: LLM, generate: Callable[[], list]) -> Run:
    """`generate()` (a call of `llm` that returns its RequestOutputs), timed, with the
    counters it moved."""
    before = read_counters(llm)
    started = time.perf_counter()
    outputs = generate()
    seconds = time.perf_counter() - started
    counters = read_counters(llm) - before
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return Run(tokens, seconds, counters, [o.outputs[0].text for o in outputs])


def set_engine_mode(mode: str) -> None:
    """Environment for an engine of ENGINE_MODES `mode`, set in the child process that runs
    it (so it changes no other engine)."""
    multiprocess = mode == "multiprocess"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    if multiprocess:  # collective_rpc pickles the drafting timer to the engine core, over
        # a socket that links only this bench's own two processes
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"


@contextlib.contextmanager
def engine(
    target: str | Path, spec: dict | None, batch_size: int, **engine_args: Any
) -> Iterator[LLM]:
    """An engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set: a separate
    engine-core process busy-polls a core), with metrics on; torn down on exit."""
    import gc

    from vllm_clover.engine import start_llm

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = start_llm(
        str(target),
        speculative_config=spec,
        max_num_seqs=batch_size,
        disable_log_stats=False,
        **engine_args,
    )
    try:
        yield llm
    finally:
        del llm
        gc.collect()
