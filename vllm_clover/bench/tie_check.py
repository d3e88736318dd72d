"""The bench's tie check: where a T = 0 run's output parts from its round's vanilla output,
was vanilla's best token a rounding tie there, or did it clearly lead (a bug)?

In float32 no output should part; in bfloat16 some do, at rounding ties (bench/ties.py,
docs/equivalence.md). After every timed engine, one untimed vanilla engine per (engine mode,
batch size) whose runs parted reruns those chats greedily with two logprobs per position,
with the timed vanilla engines' settings, and `report.py` gives each parted prompt vanilla's
top-2 gap at its first differing token.

Example, batch size 1, 8 chats: round 0's clover parts from vanilla at chat 3, token 17;
round 1's at chat 3, token 17 and chat 5, token 40. One engine reruns chat 3 for 18 tokens and
chat 5 for 41, and both rounds read their gaps from those reruns. At batch size 4 it reruns
all 8 chats whole, so that the same requests share the same steps as in the timed runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_clover.bench.config import BenchConfig, ignores_eos
from vllm_clover.bench.measure import Run, engine, set_engine_mode
from vllm_clover.bench.prompts import Chat
from vllm_clover.bench.report import round_key, round_vanillas
from vllm_clover.bench.ties import VanillaRerun, first_difference, rerun_vanilla

GroupKey = tuple[str, int]  # (engine mode, batch size)


@dataclass(frozen=True)
class TieJob:
    """One vanilla rerun engine: the chats to rerun and for how many tokens."""

    target: str
    engine_mode: str
    batch_size: int
    chats: list[Chat]
    lengths: dict[int, int]  # chat index -> tokens up to and including its latest parting
    max_tokens: int  # the timed runs'; every chat reruns this long above batch size 1
    dtype: str
    compiled: bool
    ignore_eos: bool  # the timed runs' at T = 0

    @property
    def key(self) -> GroupKey:
        return (self.engine_mode, self.batch_size)


def parted_lengths(results: list[tuple[Any, dict[float, Run], Any]]) -> dict[GroupKey, dict]:
    """Per (engine mode, batch size), each chat that some T = 0 run parted at, with the
    tokens its rerun needs (the latest first difference + 1). Runs are compared with the
    vanilla run of their round, engine mode and batch size."""
    vanilla = round_vanillas(results)
    groups: dict[GroupKey, dict[int, int]] = {}
    for job, runs, _ in results:
        reference = vanilla.get(round_key(job, 0.0))
        if job.method.kind == "vanilla" or 0.0 not in runs or reference is None:
            continue
        for i, (a, b) in enumerate(zip(reference.tokens, runs[0.0].tokens, strict=True)):
            if (first := first_difference(a, b)) is not None:
                lengths = groups.setdefault((job.engine_mode, job.batch_size), {})
                lengths[i] = max(lengths.get(i, 0), first + 1)
    return groups


def tie_jobs(
    config: BenchConfig, target: str, results: list[tuple[Any, dict[float, Run], Any]]
) -> list[TieJob]:
    """The rerun engines the timed `results` (EngineJob, runs, settings) call for."""
    chats = {(job.engine_mode, job.batch_size): job.chats for job, _, _ in results}
    return [
        TieJob(
            target,
            mode,
            batch,
            chats[mode, batch],
            lengths,
            config.max_tokens,
            config.dtype,
            config.compiled,
            ignores_eos(config.ignore_eos, 0.0),
        )
        for (mode, batch), lengths in parted_lengths(results).items()
    ]


def run_tie_job(job: TieJob) -> dict[int, VanillaRerun]:
    """(In a child process.) The reruns of `job`, by chat index."""
    set_engine_mode(job.engine_mode)
    eager = not job.compiled
    with engine(job.target, None, job.batch_size, dtype=job.dtype, enforce_eager=eager) as llm:
        whole = None if job.batch_size == 1 else job.max_tokens
        return rerun_vanilla(llm, job.chats, job.lengths, whole, job.ignore_eos)
