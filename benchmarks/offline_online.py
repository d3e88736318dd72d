"""Offline head evaluation against vLLM: the same heads on the same greedy answers.

vLLM decodes the first N MT-Bench first turns greedily while the heads draft a full K = 4
chain at every step (``draft_budget`` fixed, ``draft_confidence`` 0: no draft withheld); its
counters give the acceptance per chain position over the steps decoding took. The answers it
wrote then become the data of ``eval-heads`` (teacher-forced, on the Hugging Face target in
float32), which reports two views of the same predictions:

- over every start position (``tau``: the figure docs/heads.md tabulates and the scaling
  law is fitted on), and
- over the decode walk (``step_tau``: only the positions where greedy decoding starts a step,
  the steps vLLM counts).

Where the walk matches vLLM, the offline/online difference is which positions count, not the
heads or the engine. ``--medusa`` adds vLLM-native Medusa heads (``export-medusa``), run by
vLLM's own Medusa proposer with the same K = 4 chain: online only, since ``eval-heads``
reads Clover checkpoints.

    python benchmarks/offline_online.py --heads checkpoints/smollm2-135m-instruct-clover2 \
        checkpoints/smollm2-135m-instruct-clover --prompts 40 --max-tokens 64 \
        --json docs/bench/heads/offline_online.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from vllm_clover.bench.measure import engine, timed_chat
from vllm_clover.bench.prompts import Chat, load_prompts, take_prompts
from vllm_clover.training.config import EvalConfig
from vllm_clover.training.evaluate import eval_heads

NUM_DRAFTS = 4


def clover_spec(heads: Path) -> dict:
    """Clover heads drafting a full chain at every step: no budget, no confidence stop."""
    return {
        "method": "clover",
        "model": str(heads),
        "num_speculative_tokens": NUM_DRAFTS,
        "draft_budget": "fixed",
        "draft_confidence": 0.0,
    }


def medusa_spec(heads: Path) -> dict:
    """vLLM-native Medusa heads: vLLM's proposer drafts a full chain at every step."""
    return {"method": "medusa", "model": str(heads), "num_speculative_tokens": NUM_DRAFTS}


def online(
    target: Path, spec: dict, chats: list[Chat], max_tokens: int, batch_size: int
) -> tuple[dict, list]:
    """vLLM's chain acceptance with every draft verified, and the answers it wrote."""
    from vllm import SamplingParams

    with engine(target, spec, batch_size) as llm:
        run = timed_chat(llm, chats, SamplingParams(temperature=0, max_tokens=max_tokens))
    metrics = {
        "steps": run.counters.drafts,
        "acceptance": run.counters.acceptance_rates,
        "tau": run.counters.tau,
        "output_tokens": run.output_tokens,
    }
    return metrics, run.texts


def offline(target: Path, heads: Path, chats: list[Chat], answers: list[str]) -> dict:
    """``eval-heads`` on vLLM's answers: every-start and decode-walk acceptance."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "answers.jsonl"
        with data.open("w") as out:
            for i, (chat, answer) in enumerate(zip(chats, answers, strict=True)):
                messages = [*chat, {"role": "assistant", "content": answer}]
                out.write(json.dumps({"id": f"answer-{i}", "messages": messages}) + "\n")
        cfg = EvalConfig(
            target=str(target),
            heads=[str(heads)],
            data=str(data),
            eval_fraction=0.0,
            max_seq_len=1024,
            progress=False,
        )
        (result,) = eval_heads(cfg).values()
    per_start = [float(x) for x in result["top1"]]  # h_i top-1 over every start (not cumulative)
    return {
        "top1": per_start,
        "tau": result["tau"],
        "steps": result["decode_steps"],
        "step_acceptance": result["step_acceptance"],
        "step_tau": result["step_tau"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=Path, nargs="*", default=[], help="Clover heads")
    parser.add_argument("--medusa", type=Path, nargs="*", default=[], help="vLLM Medusa heads")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4, help="the engine's max_num_seqs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from vllm_clover.assets.target import fetch_reference_target

    target = fetch_reference_target()
    chats = take_prompts(load_prompts(), args.prompts)
    run = (chats, args.max_tokens, args.batch_size)
    settings = {
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "batch_size": args.batch_size,
    }
    report = {"args": settings, "heads": {}}
    for heads in args.heads:
        vllm_side, answers = online(target, clover_spec(heads), *run)
        report["heads"][str(heads)] = {
            "vllm": vllm_side,
            "offline": offline(target, heads, chats, answers),
        }
    for heads in args.medusa:
        report["heads"][str(heads)] = {"vllm": online(target, medusa_spec(heads), *run)[0]}
    for heads, r in report["heads"].items():
        print_heads(heads, r)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


def print_heads(heads: str, r: dict) -> None:
    v = r["vllm"]
    print(f"{Path(heads).name}")
    print(f"  vLLM  tau {v['tau']:.3f}  steps {v['steps']}  by position {fmt(v['acceptance'])}")
    if "offline" in r:
        o = r["offline"]
        walk = fmt(o["step_acceptance"])
        print(f"  walk  tau {o['step_tau']:.3f}  steps {o['steps']}  by position {walk}")
        print(f"  all starts tau {o['tau']:.3f}  top-1 per head {fmt(o['top1'])}")


def fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    main()
