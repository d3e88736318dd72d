"""Heads checked through vLLM on held-out prompts (what `make-heads` ends with): vanilla and
Clover in float32, greedy, one request at a time, every head drafting at every step. Why:
docs/design/engine-layer.md, "The make-heads check"."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_clover.bench.measure import Run, engine, identical_outputs, timed_run
from vllm_clover.engine import REFERENCE_ENGINE_ARGS, position_limit
from vllm_clover.training.config import TrainingError
from vllm_clover.training.generate_data import prompt_ids


@dataclass(frozen=True)
class ServeCheck:
    """The check's figures (JSON-ready)."""

    prompts: int
    identical: int  # outputs token-identical to vanilla's
    tau: float | None  # 1 + accepted / drafts (None: nothing drafted)
    acceptance: list[float]  # per draft position
    vanilla_tokens_per_s: float
    clover_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.clover_tokens_per_s / self.vanilla_tokens_per_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": self.speedup}


def serve_check(
    target: str,
    heads: Path,
    chats: list[list[dict[str, str]]],
    max_tokens: int,
    count: int,
    method: str = "clover",
    num_speculative_tokens: int | None = None,
) -> ServeCheck:
    """Run the first `count` of `chats` that fit the engine's context with `max_tokens` more
    through vLLM, without and with the heads (vLLM's speculative `method` with them: clover,
    or eagle3 for a train-eagle3 folder, whose K vLLM needs given); the figures."""
    prompts = fitting_prompts(target, chats, max_tokens)[:count]
    if not prompts:
        raise TrainingError(f"no held-out prompt leaves {max_tokens} tokens of the context")
    vanilla = _timed(target, prompts, max_tokens, None)
    spec = {"method": method, "model": str(heads)}
    if method == "clover":
        spec["draft_budget"] = "fixed"  # every head at every step (the module's doc)
    if num_speculative_tokens is not None:
        spec["num_speculative_tokens"] = num_speculative_tokens
    clover = _timed(target, prompts, max_tokens, spec)
    counters = clover.counters
    return ServeCheck(
        prompts=len(prompts),
        identical=identical_outputs(vanilla.tokens, clover.tokens),
        tau=counters.tau,
        acceptance=counters.acceptance_rates,
        vanilla_tokens_per_s=vanilla.tokens_per_second,
        clover_tokens_per_s=clover.tokens_per_second,
    )


def fitting_prompts(target: str, chats: list[list[dict[str, str]]], max_tokens: int) -> list:
    """`chats` as token prompts, templated as generate-data templates them, keeping those that
    leave `max_tokens` of the engine's context (the reference engine's, within the target's)."""
    from transformers import AutoTokenizer
    from vllm import TokensPrompt

    ids = prompt_ids(AutoTokenizer.from_pretrained(target), chats)
    room = min(REFERENCE_ENGINE_ARGS["max_model_len"], position_limit(target)) - max_tokens
    return [TokensPrompt(prompt_token_ids=x) for x in ids if len(x) <= room]


def _timed(target: str, prompts: list, max_tokens: int, spec: dict | None) -> Run:
    """One engine (float32, one request at a time): a warm-up, then the prompts, timed."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    with engine(target, spec, 1, dtype="float32") as llm:
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
        return timed_run(llm, lambda: llm.generate(prompts, greedy, use_tqdm=False))
