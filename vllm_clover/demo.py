"""`vllm-clover demo`: the project's main job on the bundled reference target.

Generates the same MT-Bench answers twice through vLLM, once plainly and once with Clover
speculative decoding, and prints what a user wants to know: are the outputs identical (in
float32 they must be; in bfloat16, where one is not, a third, untimed vanilla engine shows
that it parts from vanilla's at a rounding tie, else the demo fails: ``bench/ties.py``), how
many tokens each verification step yields (tau), and the speedup.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from vllm_clover.assets.data import fetch_mtbench, mtbench_questions
from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.bench.measure import Run, engine, identical_outputs, timed_chat
from vllm_clover.bench.ties import NEAR_TIE, Parting, rounding_bug, vanilla_partings
from vllm_clover.bundled import CLOVER2_HEADS

TIE_NOTE = (
    "  a verification step scores several tokens per request, matmul shapes that decoding one\n"
    "  token never runs, so where two tokens are within rounding the other may win\n"
    "  (docs/equivalence.md); --dtype float32 is token-exact"
)
# The bare "What is the capital of France?" is a rounding tie in bfloat16 for this target (its
# first tokens "L" and "The" are one bf16 step apart); asking for one sentence is not.
SANITY_QUESTION = "What is the capital of France? Answer in one sentence."
SANITY_ANSWER = "Paris"


def generate(
    target: Path, chats: list, max_tokens: int, batch_size: int, spec=None, dtype: str = "auto"
) -> Run:
    """Start an engine, generate greedily for `chats`, tear the engine down."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    with engine(target, spec, batch_size, dtype=dtype) as llm:
        llm.chat(
            chats[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False
        )  # warm-up
        run = timed_chat(llm, chats, greedy)
        sanity = llm.chat([{"role": "user", "content": SANITY_QUESTION}], greedy, use_tqdm=False)
    if SANITY_ANSWER not in sanity[0].outputs[0].text:
        raise SystemExit(f"sanity check failed: {sanity[0].outputs[0].text!r}")
    return run


def report(vanilla: Run, clover: Run, num_heads: int, dtype: str, partings: list[Parting]) -> None:
    """Print output equality (with where and why outputs part), tau, per-position acceptance
    and the speedup; then SystemExit if an output parted from vanilla's anywhere but at a
    rounding tie."""
    counters = clover.counters
    same = identical_outputs(vanilla.tokens, clover.tokens)
    print(f"\ngreedy outputs identical to vanilla: {same}/{len(vanilla.tokens)} prompts")
    _print_partings(partings, dtype)
    if counters.drafts:
        print(
            f"mean acceptance length tau = 1 + accepted/drafts = {counters.tau:.2f} "
            f"tokens per step (K = {num_heads} drafts)"
        )
        rates = ", ".join(f"{rate:.2f}" for rate in counters.acceptance_rates)
        print(f"acceptance rate per draft position: {rates}")
    print(
        f"vanilla: {vanilla.tokens_per_second:6.1f} tokens/s\n"
        f"clover : {clover.tokens_per_second:6.1f} tokens/s  "
        f"(speedup {clover.tokens_per_second / vanilla.tokens_per_second:.2f}x, same run)"
    )
    bugs = [p for p in partings if p.is_bug(dtype)]
    if bugs:
        where = "; ".join(f"prompt {p.prompt} parts from vanilla at token {p.token}" for p in bugs)
        raise SystemExit(f"vllm-clover demo: {rounding_bug(dtype, where)}")


def _print_partings(partings: list[Parting], dtype: str) -> None:
    """One line for the ties (their top-2 gaps), one per other parting."""
    ties = [p for p in partings if p.is_tie(dtype)]
    if ties:
        gaps = ", ".join(f"{p.gap:.3g}" for p in ties)
        which = f"all {len(ties)}" if len(ties) == len(partings) else f"{len(ties)} of the"
        print(
            f"  {which} others part where vanilla's two best tokens were a {dtype} rounding tie\n"
            f"  (top-2 logit gap at the first differing token: {gaps}; a tie is <= "
            f"{NEAR_TIE[dtype]}):\n{TIE_NOTE}"
        )
    for p in partings:
        if p.gap is None:
            print(
                f"  prompt {p.prompt} parts at token {p.token}; vanilla's gap there is unknown "
                "(its rerun did not reproduce its own tokens)"
            )
        elif p.is_bug(dtype):
            print(f"  prompt {p.prompt} parts at token {p.token}, top-2 gap {p.gap:.3g}: NOT a tie")


def run_demo(
    num_prompts: int,
    max_tokens: int,
    cache_dir: str | None = None,
    heads: str | None = None,
    batch_size: int = 1,
    verbose: bool = False,
    dtype: str = "auto",
) -> None:
    """The main job, in the target's own dtype unless `dtype` says otherwise. vLLM's own log
    lines are shown only with `verbose`; a --heads folder that is not a Clover checkpoint is
    an error before any engine starts."""
    if not verbose:  # read by vLLM when it is first imported, below
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations in vLLM's code
    heads_dir = Path(heads) if heads else CLOVER2_HEADS  # the best bundled heads
    num_heads = _num_heads(heads_dir) if heads or (heads_dir / "config.json").is_file() else 0
    target = fetch_reference_target(cache_dir)
    questions = mtbench_questions(fetch_mtbench(cache_dir))[:num_prompts]
    chats = [[{"role": "user", "content": q.turns[0]}] for q in questions]
    shown = "the target's own (bfloat16)" if dtype == "auto" else dtype
    print(
        f"reference target: {target}\n{len(chats)} MT-Bench prompts, {max_tokens} new tokens "
        f"each, batch size {batch_size}, greedy, dtype {shown}"
    )
    vanilla = generate(target, chats, max_tokens, batch_size, dtype=dtype)
    print(f"sanity: {SANITY_QUESTION!r} -> contains {SANITY_ANSWER!r} [ok]")
    if not num_heads:
        print(
            f"\nno Clover heads at {heads_dir} (not a source checkout? pass --heads DIR): "
            f"vanilla only, {vanilla.tokens_per_second:.1f} tokens/s"
        )
        return
    spec = {"method": "clover", "model": str(heads_dir), "num_speculative_tokens": num_heads}
    # The demo shows the heads at work on every step, whatever a short run's timings would
    # make the goodput budget (the serving default) choose; `vllm-clover bench` measures both.
    spec["draft_budget"] = "fixed"
    clover = generate(target, chats, max_tokens, batch_size, spec, dtype)
    partings = []
    if clover.tokens != vanilla.tokens:  # where and why: one more, untimed vanilla engine
        with engine(target, None, batch_size, dtype=dtype) as llm:
            rerun_all = max_tokens if batch_size > 1 else None  # as the batches ran: see ties
            partings = vanilla_partings(llm, chats, vanilla.tokens, clover.tokens, rerun_all)
    report(vanilla, clover, num_heads, "float32" if dtype == "float32" else "bfloat16", partings)


def _num_heads(heads_dir: Path) -> int:
    """The trained heads of a Clover checkpoint; SystemExit naming the problem otherwise."""
    from vllm_clover.modeling.checkpoint import CloverCheckpointError, load_clover_config

    try:
        return load_clover_config(heads_dir).num_heads
    except CloverCheckpointError as err:
        raise SystemExit(f"vllm-clover demo: error: --heads {heads_dir}: {err}") from None
