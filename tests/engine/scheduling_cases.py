"""The prompts, parameters and vanilla outputs the scheduling and draft-budget tests share
(test_clover_scheduling.py, test_clover_budget.py; fixtures in conftest.py)."""

from pathlib import Path

from helpers import in_process_llm, mtbench_prompts

MAX_TOKENS = 24
SHARED_PREFIX = (
    "You are a meticulous assistant. Answer in plain English, in short paragraphs, "
    "and never use lists unless asked. "
) * 20  # several 128-token blocks
BLOCK = 128  # vLLM-CPU's default KV block, given explicitly where a test counts blocks


def diverging(prompts: list[dict], token: int) -> list[dict]:
    """Each prompt with the token right after its last full block below its last token
    replaced by `token` (or by token + 1 where the prompt has `token` there): a prefix-cache
    hit on the original prompt ends at that block, and the next token differs."""
    diverging = []
    for prompt in prompts:
        ids = list(prompt["prompt_token_ids"])
        at = (len(ids) - 1) // BLOCK * BLOCK
        ids[at] = token if ids[at] != token else token + 1
        diverging.append({"prompt_token_ids": ids})
    return diverging


def params_for(n, mixed=False):
    """Greedy; with mixed=True, per-request max_tokens and stop strings differ."""
    from vllm import SamplingParams

    if not mixed:
        return [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)] * n
    return [
        SamplingParams(
            temperature=0.0, max_tokens=4 + 4 * (i % 6), stop=[". "] if i % 3 == 0 else None
        )
        for i in range(n)
    ]


def generate(llm, prompts, params):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outputs]


def build_cases(reference_target: Path, mtbench_path: Path) -> dict:
    """{name: (prompts, params, vanilla outputs)} for every case, from one vanilla engine."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_target)
    plain = mtbench_prompts(tokenizer, mtbench_path, 16)
    shared = mtbench_prompts(tokenizer, mtbench_path, 16, system=SHARED_PREFIX)
    cases = {
        "plain": (plain, params_for(16)),
        "shared_prefix": (shared, params_for(16)),
        "mixed": (plain, params_for(16, mixed=True)),
        "diverging": (diverging(shared[:8], tokenizer.encode(" However")[0]), params_for(8)),
    }
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        return {name: (p, s, generate(llm, p, s)) for name, (p, s) in cases.items()}
