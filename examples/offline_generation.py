"""Offline batch generation with Clover speculative decoding in vLLM.

    python examples/offline_generation.py [--target MODEL --heads HEADS_DIR]

Generates answers to a few chat prompts with `vllm.LLM` and Clover heads (by default the
bundled ones for the reference target, SmolLM2-135M-Instruct), then prints what vLLM
measured about the speculation: drafts proposed, draft tokens accepted, and the mean
acceptance length tau (tokens per target forward pass; 1.0 = no draft ever accepted).
"""

import argparse

from vllm import LLM, SamplingParams

from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target
from vllm_clover.bundled import CLOVER2_HEADS
from vllm_clover.engine import set_cpu_env_defaults

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give three tips for staying focused while studying.",
    "Explain what a hash table is in two sentences.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=REFERENCE_TARGET, help="model folder or id")
    parser.add_argument("--heads", default=str(CLOVER2_HEADS), help="Clover checkpoint")
    args = parser.parse_args()
    # The reference target is downloaded and converted on first use, then cached.
    target = str(fetch_reference_target()) if args.target == REFERENCE_TARGET else args.target

    set_cpu_env_defaults()  # vLLM on CPU needs VLLM_CPU_KVCACHE_SPACE (GiB); ignored on GPU
    llm = LLM(
        model=target,
        # "num_speculative_tokens": K is optional; the default is every trained head.
        speculative_config={"method": "clover", "model": args.heads},
        max_model_len=2048,
        dtype="float32",  # CPU: this small model answers best in float32 (GPU: drop)
        enforce_eager=True,  # CPU: fast start (GPU: drop it to get CUDA graphs)
        disable_log_stats=False,  # keep the spec-decode counters for get_metrics()
    )
    chats = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    outputs = llm.chat(chats, SamplingParams(temperature=0.0, max_tokens=96))
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        print(f"\n>>> {prompt}\n{output.outputs[0].text.strip()}")

    counters = {m.name: m for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    drafts = counters["vllm:spec_decode_num_drafts"].value
    accepted = counters["vllm:spec_decode_num_accepted_tokens"].value
    proposed = counters["vllm:spec_decode_num_draft_tokens"].value
    per_position = counters["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    print(f"\nspeculative decoding: {drafts} drafts, {accepted}/{proposed} draft tokens accepted")
    print(
        "acceptance rate per draft position:", ", ".join(f"{n / drafts:.2f}" for n in per_position)
    )
    print(f"mean acceptance length tau = 1 + accepted/drafts = {1 + accepted / drafts:.2f}")


if __name__ == "__main__":  # vLLM starts worker processes with spawn on CPU
    main()
