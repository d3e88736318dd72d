"""Offline: how often vLLM would accept a head's draft at T > 0, argmax against drawn.

At temperature T the target samples x_{t+2+i} from p = softmax(target logits / T). A draft
d verified as a one-hot (greedy) draft is accepted with probability p(d); a draft drawn from
the head's q = softmax(head logits / T) and verified against q (vLLM's
``draft_sample_method`` "probabilistic") with probability sum_x min(p(x), q(x)). For every
position of the target's own T-sampled answers to MT-Bench first turns, and every head i
(fed the answer's true tokens, so each figure is the acceptance at position i given that the
drafts before it were accepted), this prints both, averaged:

    python benchmarks/drawn_acceptance.py --heads checkpoints/smollm2-135m-instruct-clover \
        checkpoints/smollm2-135m-instruct-clover2 --prompts 12 --max-tokens 96 \
        --json docs/bench/drawn/offline.json

Hugging Face target in float32 on the CPU, the answers sampled with a fixed seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vllm_clover.assets.data import fetch_mtbench, mtbench_questions
from vllm_clover.assets.target import fetch_reference_target
from vllm_clover.modeling import load_clover, shift_tokens_for_heads


def sampled_answers(lm, tokenizer, prompts: int, max_tokens: int, temperature: float):
    """[(prompt length, ids (1, L))] of the target's answers sampled at `temperature`."""
    answers = []
    for question in mtbench_questions(fetch_mtbench())[:prompts]:
        chat = [{"role": "user", "content": question.turns[0]}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        ids = getattr(ids, "input_ids", ids)
        out = lm.generate(
            ids, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
            max_new_tokens=max_tokens,
        )  # fmt: skip
        answers.append((ids.shape[1], out))
    return answers


@torch.no_grad()
def acceptance(lm, heads_dir: str, answers, temperature: float) -> dict[str, list[float]]:
    """Per head: mean p(argmax q) ("greedy") and mean sum min(p, q) ("drawn")."""
    model = load_clover(
        heads_dir, lm.lm_head.weight, lm.model.embed_tokens.weight, dtype=torch.float32
    ).eval()
    k, vocab_ids = model.config.num_heads, model.tables.draft_vocab_ids
    sums = {"greedy": [0.0] * k, "drawn": [0.0] * k}
    counts = [0] * k
    for prompt_len, ids in answers:
        out = lm(ids, output_hidden_states=True)
        p = (out.logits[0] / temperature).softmax(-1)  # (L, V): p of the token after t
        if vocab_ids is not None:
            p = p[:, vocab_ids]  # (L, N): a draft outside the draft vocabulary is never made
        z = model(out.hidden_states[-1], shift_tokens_for_heads(ids, k).input_ids)
        q = (z[0] / temperature).softmax(-1)  # (L, K, N)
        for i in range(k):
            rows = torch.arange(prompt_len - 1, ids.shape[1] - 2 - i)  # answer positions t
            p_i, q_i = p[rows + 1 + i], q[rows, i]  # head i at t predicts x_{t+2+i}
            sums["greedy"][i] += float(p_i.gather(1, q_i.argmax(-1, keepdim=True)).sum())
            sums["drawn"][i] += float(torch.minimum(p_i, q_i).sum())
            counts[i] += len(rows)
    return {name: [s / n for s, n in zip(v, counts, strict=True)] for name, v in sums.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", nargs="+", required=True)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = fetch_reference_target()
    tokenizer = AutoTokenizer.from_pretrained(target)
    lm = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    torch.manual_seed(args.seed)
    answers = sampled_answers(lm, tokenizer, args.prompts, args.max_tokens, args.temperature)
    results = {"settings": vars(args) | {"json": str(args.json)}, "heads": {}}
    for heads in args.heads:
        rates = acceptance(lm, heads, answers, args.temperature)
        results["heads"][Path(heads).name] = rates
        for name, values in rates.items():
            print(f"{Path(heads).name:40s} {name:7s} " + " ".join(f"{v:.3f}" for v in values))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
