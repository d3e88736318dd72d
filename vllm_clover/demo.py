"""`vllm-clover demo`: the project's main job on the bundled reference target.

Today it runs plain vLLM generation (the Clover proposer is not there yet) on MT-Bench first
turns, checks the model's answer to a known question, and prints throughput.
"""

from __future__ import annotations

import time

from vllm_clover.assets.data import fetch_mtbench, mtbench_questions
from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.engine import start_llm

SANITY_QUESTION = "What is the capital of France?"
SANITY_ANSWER = "Paris"


def run_demo(num_prompts: int, max_tokens: int, cache_dir: str | None = None) -> None:
    from vllm import SamplingParams

    target = fetch_reference_target(cache_dir)
    questions = mtbench_questions(fetch_mtbench(cache_dir))[:num_prompts]
    started = time.perf_counter()
    llm = start_llm(str(target))
    print(f"\nengine started in {time.perf_counter() - started:.1f} s")

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    sanity = llm.chat([{"role": "user", "content": SANITY_QUESTION}], greedy)[0].outputs[0].text
    verdict = "ok" if SANITY_ANSWER in sanity else "UNEXPECTED"
    print(f"sanity [{verdict}]: {SANITY_QUESTION!r} -> {sanity!r}")

    conversations = [[{"role": "user", "content": q.turns[0]}] for q in questions]
    started = time.perf_counter()
    outputs = llm.chat(conversations, greedy, use_tqdm=False)
    seconds = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    for question, output in zip(questions, outputs):
        text = output.outputs[0].text.strip().replace("\n", " ")
        print(f"\n[{question.category}] {question.turns[0][:70]}...\n  -> {text[:160]}...")
    print(f"\nvanilla decoding: {len(outputs)} prompts, {generated} tokens in {seconds:.1f} s "
          f"= {generated / seconds:.1f} tokens/s (batch of {len(outputs)}, temperature 0)")
    if verdict != "ok":
        raise SystemExit(f"sanity check failed: expected {SANITY_ANSWER!r} in {sanity!r}")
