"""`vllm-clover make-heads`: one command from a target to served heads, resumable: preflight,
data, train, eval and a check through vLLM, then a results table in the heads' model card.
The steps: docs/training.md, "One command: `make-heads`"."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from vllm_clover.training.config import (
    EvalConfig,
    GenerateConfig,
    TrainConfig,
    TrainingError,
)
from vllm_clover.training.flags import opt

STATE_EVERY = 50  # optimizer steps between saved training states (resume)
EVAL_FRACTION = 0.1  # of the answers held out for the offline figures
CARD_SECTION = "\n## Checked by `vllm-clover make-heads`"


@dataclass
class MakeHeadsConfig:
    """The one command's knobs; everything else takes the separate commands' defaults."""

    target: str = opt(
        "", "target model (folder, cached HF id or 'smollm2-135m-instruct')", required=True
    )
    out: str = opt("", "working folder: data.jsonl, heads/, eval.json, check.json", required=True)
    prompts: str | None = opt(
        None, "prompts or conversations to answer (default: bundled ShareGPT)"
    )
    samples: int = opt(160, "prompts the target answers for training")
    max_new_tokens: int = opt(128, "tokens per answer")
    num_heads: int = opt(4, "draft heads K")
    draft_vocab_size: int = opt(8192, "draft vocabulary (capped at the target's)")
    epochs: int = opt(4, "passes over the answers")
    lr: float = opt(1e-3, "peak learning rate (train's --lr)")
    time_budget: float | None = opt(None, "stop training after this many minutes")
    augmenting_block: bool = opt(True, "the Augmenting Block")
    dtype: str = opt(
        "auto",
        "the target's dtype while caching and training: auto is bfloat16 on a GPU or a CPU with "
        "bf16 units (AMX, AVX512-BF16), else float32 (bf16 there runs ~12x slower)",
        choices=("auto", "float32", "bfloat16"),
    )
    check_prompts: int = opt(8, "held-out prompts checked through vLLM")
    check_tokens: int = opt(64, "tokens per checked prompt")
    cache_dir: str | None = opt(None, "hidden-state cache root")
    seed: int = opt(0, "seed of the heads, data order and split")


def train_config(cfg: MakeHeadsConfig, vocab_size: int | None = None) -> TrainConfig:
    out = Path(cfg.out)
    state = out / "heads.train-state"
    return TrainConfig(
        target=cfg.target,
        out=str(out / "heads"),
        data=str(out / "data.jsonl"),
        num_heads=cfg.num_heads,
        draft_vocab_size=min(cfg.draft_vocab_size, vocab_size or cfg.draft_vocab_size) or None,
        augmenting_block=cfg.augmenting_block,
        epochs=cfg.epochs,
        lr=cfg.lr,
        time_budget=None if cfg.time_budget is None else 60 * cfg.time_budget,
        dtype=training_dtype(cfg.dtype),
        cache_dir=cfg.cache_dir,
        seed=cfg.seed,
        eval_fraction=EVAL_FRACTION,
        eval_every=0,
        save_every=STATE_EVERY,
        resume=str(state) if state.is_dir() else None,
        overwrite=True,
    )


def training_dtype(choice: str) -> str:
    """--dtype auto resolved: bfloat16 where it multiplies in hardware, float32 elsewhere (where
    bfloat16 is emulated, the teacher and training run far slower in it: docs/training.md)."""
    import torch

    from vllm_clover.cpu.isa import cpu_flags, isa_family

    if choice != "auto":
        return choice
    if torch.cuda.is_available():
        return "bfloat16"
    return "bfloat16" if isa_family(cpu_flags()) in ("AMX", "AVX512-BF16") else "float32"


def make_heads(cfg: MakeHeadsConfig) -> dict:
    """Run (or resume) every step; returns the results table's figures."""
    from vllm_clover.training.generate_data import generate_data

    if cfg.dtype == "auto":
        cfg = replace(cfg, dtype=training_dtype(cfg.dtype))
        print(f"make-heads: --dtype auto -> {cfg.dtype}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = preflight(cfg)
    data = out / "data.jsonl"
    if not data.is_file():
        generate_data(
            GenerateConfig(
                target=cfg.target,
                out=str(data),
                data=cfg.prompts,
                max_samples=cfg.samples,
                max_new_tokens=cfg.max_new_tokens,
                seed=cfg.seed,
            )
        )
    else:
        print(f"make-heads: reusing {data}")
    heads = _trained(cfg, vocab)
    figures = {"eval": _evaluated(cfg, heads), "check": _checked(cfg, heads)}
    table = results_table(figures)
    print(table)
    card = heads / "README.md"
    kept = card.read_text().split(CARD_SECTION)[0].rstrip("\n")  # a rerun replaces its section
    card.write_text(f"{kept}\n{CARD_SECTION}\n\n{table}\n")
    return figures


def preflight(cfg: MakeHeadsConfig) -> int:
    """Load the target and run train's own checks on it (TrainingError naming the flag that
    fixes a refusal); its vocabulary size."""
    import torch

    from vllm_clover.training.network import preflight as check
    from vllm_clover.training.runtime import resolve_device
    from vllm_clover.training.teacher import load_teacher

    teacher = load_teacher(cfg.target, resolve_device("auto"), getattr(torch, cfg.dtype))
    try:
        vocab = int(teacher.lm_head.shape[0])
        check(train_config(cfg, vocab), teacher)
    finally:
        teacher.release()
    return vocab


def _trained(cfg: MakeHeadsConfig, vocab: int) -> Path:
    from vllm_clover.training.trainer import train

    heads = Path(cfg.out) / "heads"
    if (heads / "model.safetensors").is_file():
        print(f"make-heads: reusing {heads}")
        return heads
    result = train(train_config(cfg, vocab))
    print(result.summary())
    if result.out is None:
        raise TrainingError("training stopped before its end; run make-heads again to resume")
    return heads


def _evaluated(cfg: MakeHeadsConfig, heads: Path) -> dict:
    from vllm_clover.training.evaluate import eval_heads

    path = Path(cfg.out) / "eval.json"
    if not path.is_file() or path.stat().st_mtime < (heads / "model.safetensors").stat().st_mtime:
        train = train_config(cfg)
        eval_heads(
            EvalConfig(
                target=cfg.target,
                heads=[str(heads)],
                data=train.data,
                max_seq_len=train.max_seq_len,
                eval_fraction=train.eval_fraction,
                seed=cfg.seed,
                cache_dir=cfg.cache_dir,
                dtype=cfg.dtype,  # train's: the held-out signal is cached already
                json=str(path),
                progress=False,
            )
        )
    return json.loads(path.read_text())[str(heads)]


def _checked(cfg: MakeHeadsConfig, heads: Path) -> dict:
    from vllm_clover.bench.check import serve_check
    from vllm_clover.training.data import load_conversations
    from vllm_clover.training.teacher import resolve_target

    path = Path(cfg.out) / "check.json"
    if path.is_file() and path.stat().st_mtime >= (heads / "model.safetensors").stat().st_mtime:
        return json.loads(path.read_text())
    # a few times more than asked: the check keeps those that fit the engine's context
    pool = cfg.samples + 4 * cfg.check_prompts
    held_out = load_conversations(cfg.prompts, pool)[cfg.samples :]
    chats = [[{"role": "user", "content": c.messages[0].content}] for c in held_out]
    if not chats:
        raise TrainingError(f"no prompt left after the first --samples {cfg.samples} to check")
    target, _ = resolve_target(cfg.target)
    figures = serve_check(target, heads, chats, cfg.check_tokens, cfg.check_prompts).to_json()
    path.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def results_table(figures: dict) -> str:
    """The held-out and through-vLLM figures, as Markdown."""
    ev, check = figures["eval"], figures["check"]
    top1 = " ".join(f"{a:.2f}" for a in ev["top1"])
    rates = " ".join(f"{a:.2f}" for a in check["acceptance"])
    tau = "-" if check["tau"] is None else f"{check['tau']:.2f}"
    return "\n".join(
        [
            "| measure | value |",
            "|---|---|",
            f"| held-out answers: top-1 per head | {top1} |",
            f"| held-out answers: offline tau | {ev['tau']:.2f} |",
            f"| through vLLM, {check['prompts']} unseen prompts: tau | {tau} |",
            f"| through vLLM: acceptance per draft position | {rates} |",
            f"| through vLLM: tokens/s, vanilla -> Clover (float32, batch 1, every head) | "
            f"{check['vanilla_tokens_per_s']:.1f} -> {check['clover_tokens_per_s']:.1f} "
            f"({check['speedup']:.2f}x) |",
            f"| greedy outputs equal to vanilla | {check['identical']}/{check['prompts']} |",
        ]
    )
