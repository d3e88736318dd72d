"""Typed configurations of `train`, `eval-heads` and `generate-data`: one dataclass each,
every field a flag of its command (the flags are built from the fields: ``training/flags.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_clover.training.flags import opt


class TrainingError(RuntimeError):
    """A training/evaluation input or environment problem, with a message naming it."""


@dataclass
class TrainConfig:
    """Everything a training run depends on (recorded in the model card and the state)."""

    target: str = opt(
        "",
        "target model: a folder, a cached Hugging Face id, or 'smollm2-135m-instruct'",
        required=True,
    )
    out: str = opt("", "output folder of the final Clover checkpoint", required=True)
    data: str | None = opt(
        None,
        "ShareGPT-style .json/.jsonl, our {id, messages} JSONL or "
        "{prompt, response} JSONL (default: the bundled ShareGPT set)",
    )
    max_samples: int | None = opt(None, "use only the first N conversations of the data")
    max_seq_len: int = opt(1024, "truncate every tokenised conversation to this many tokens")
    eval_fraction: float = opt(0.02, "held-out fraction of the sequences for evaluation")
    # network
    num_heads: int = opt(3, "number of draft heads K")
    num_augmenting_layers: int | None = opt(
        None, "decoder layers in the Augmenting Block (default 1; 2 with --clover2)"
    )
    attention_decoder: bool = opt(True, "the Attention Decoder")
    regressive_connection: bool = opt(True, "the Regressive Connection")
    augmenting_block: bool = opt(True, "the Augmenting Block")
    medusa: bool = opt(False, "Medusa-1 baseline: all three Clover components off")
    clover2: bool = opt(
        False,
        "Clover-2 (arXiv 2408.00264): next token fused before a 2-layer Augmenting Block "
        "(unless --num-augmenting-layers says otherwise), plain projection per head, "
        "hidden-state term 10, head weights 0.7**i (unless given); with "
        "--no-attention-decoder the later heads read their token by projection alone",
    )
    fuse_next_token: bool = opt(
        False, "fuse H_t with the next token's embedding before the Augmenting Block"
    )
    head_projection: str = opt(
        "residual",
        "head i's feature: residual (Medusa block, the paper) or linear (W_i [h_i ; e_i])",
        choices=("residual", "linear"),
    )
    augmenting_gate: bool = opt(
        False, "a learned per-channel gate around the Augmenting Block, zero at start"
    )
    draft_vocab_size: int | None = opt(None, "score only the N most frequent training tokens")
    target_layers: list[int] | None = opt(
        None,
        "target decoder layers whose input the heads also read besides H, fused in as "
        "x = H + sum_j W_j rmsnorm(L_j) with W_j zero at start (EAGLE-3's 2, 15, 27 on a "
        "30-layer target; docs/heads.md)",
        nargs="+",
    )
    # optimisation
    epochs: int = opt(1, "passes over the training sequences")
    max_tokens: int | None = opt(None, "stop after this many training tokens (budget)")
    time_budget: float | None = opt(
        None,
        "seconds this command may take in all (start-up, data and teacher included): after "
        "the first steps the plan is cut to the steps that fit, and the lr schedule follows "
        "the shorter plan, so the run still ends annealed",
    )
    batch_size: int = opt(4, "sequences per micro-batch per process")
    grad_accum: int = opt(1, "micro-batches per optimizer step")
    lr: float = opt(1e-3, "peak learning rate (AdamW, betas 0.9/0.999)")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    warmup_fraction: float = opt(0.03, "linear warmup share of the steps, then cosine to 0")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)")
    head_weight_base: float | None = opt(
        None, "loss weight of head i is base**i (default 0.8; 0.7 with --clover2)"
    )
    hidden_loss_weight: float | None = opt(
        None, "weight of SmoothL1(z_i, H_{t+1+i}) (default 0; 10 with --clover2)"
    )
    soft_labels: bool = opt(
        True,
        "distillation against the target's distribution (off: one-hot data "
        "tokens, the Medusa-1 recipe, for comparison)",
    )
    label_top_k: int | None = opt(
        None,
        "soft labels cut to the target's k likeliest tokens, renormalised (a top-k KL; "
        "1: the target's argmax as a hard label)",
    )
    seed: int = opt(0, "seed of the initialisation, data order and split")
    init_from: str | None = opt(
        None,
        "start from this Clover checkpoint's weights and draft vocabulary instead of a fresh "
        "network (continued training on new data: a new optimizer and lr schedule); the "
        "network flags must describe the checkpoint's network",
    )
    dtype: str = opt(
        "float32", "compute dtype: float32 or bfloat16 (autocast)", choices=("float32", "bfloat16")
    )
    device: str = opt("auto", "cpu, cuda, cuda:N or auto")
    save_dtype: str = opt(
        "bfloat16", "dtype of the saved checkpoint's weights", choices=("float32", "bfloat16")
    )
    # bookkeeping
    cache_dir: str | None = opt(
        None, "hidden-state cache root (default: <vllm-clover cache>/hidden-states)"
    )
    teacher_batch_tokens: int = opt(8192, "padded tokens per target forward when caching")
    compile_teacher: bool = opt(
        False,
        "run the target under torch.compile while caching (lengths padded to multiples of "
        "128, one compile each; faster with --dtype bfloat16 on CPU: docs/training.md)",
    )
    compile_heads: bool = opt(
        False,
        "run the head network and each head's cross-entropy (and their backward) under "
        "torch.compile: one compile per run, then more training tokens/s (docs/training.md)",
    )
    teacher_signal: str = opt(
        "auto",
        "the training split's target signal: cache (on disk, reused across runs), stream "
        "(computed per batch, no disk) or auto (stream when the cache would grow by over 20 GiB)",
        choices=("auto", "cache", "stream"),
    )
    train_argmax: str = opt(
        "auto",
        "vocabulary rows of the target argmax cached for the training split: full, draft (the "
        "draft vocabulary's rows only; much faster with 100k+ vocabularies, training-time top1 "
        "then means agreement with the target's best draft token) or auto (draft when "
        "--draft-vocab-size is set and the vocabulary exceeds 131,072 tokens); the held-out "
        "split always uses the full vocabulary",
        choices=("auto", "full", "draft"),
    )
    eval_every: int = opt(200, "evaluate every N steps (0 = only at the end)")
    save_every: int = opt(200, "save resumable training state every N steps (0 = only at the end)")
    stop_after: int | None = opt(
        None, "stop resumably after N steps in this invocation (no final checkpoint)"
    )
    resume: str | None = opt(
        None,
        "resume from a training-state folder (bare flag: <out>.train-state)",
        nargs="?",
        const="auto",
    )
    overwrite: bool = opt(False, "replace an existing --out folder")
    progress: bool = opt(True, "the progress bar")

    def __post_init__(self) -> None:
        if self.medusa:
            self.attention_decoder = self.regressive_connection = self.augmenting_block = False
        if self.clover2:  # the Attention Decoder stays the user's choice: an ablation
            self.regressive_connection = self.augmenting_block = True
            self.fuse_next_token, self.head_projection = True, "linear"
        defaults = (2, 0.7, 10.0) if self.clover2 else (1, 0.8, 0.0)
        if self.num_augmenting_layers is None:
            self.num_augmenting_layers = defaults[0]
        if self.head_weight_base is None:
            self.head_weight_base = defaults[1]
        if self.hidden_loss_weight is None:
            self.hidden_loss_weight = defaults[2]
        self.validate()

    def validate(self) -> None:
        checks = [
            (bool(self.target), "--target is required"),
            (bool(self.out), "--out is required"),
            (self.num_heads >= 1, f"--num-heads must be >= 1, got {self.num_heads}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.grad_accum >= 1, f"--grad-accum must be >= 1, got {self.grad_accum}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (
                self.max_seq_len >= self.num_heads + 2,
                f"--max-seq-len must be >= num_heads + 2, got {self.max_seq_len}",
            ),
            (
                0.0 <= self.eval_fraction < 1.0,
                f"--eval-fraction must be in [0, 1), got {self.eval_fraction}",
            ),
            (
                0.0 <= self.warmup_fraction < 1.0,
                f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}",
            ),
            (self.lr > 0, f"--lr must be > 0, got {self.lr}"),
            (
                self.label_top_k is None or (self.label_top_k > 0 and self.soft_labels),
                f"--label-top-k must be > 0 and needs soft labels, got {self.label_top_k}",
            ),
            (not (self.medusa and self.clover2), "--medusa and --clover2 exclude each other"),
            (
                not (self.fuse_next_token or self.augmenting_gate) or self.augmenting_block,
                "--fuse-next-token and --augmenting-gate need the Augmenting Block",
            ),
            (self.max_tokens is None or self.max_tokens > 0, "--max-tokens must be > 0"),
            (self.time_budget is None or self.time_budget > 0, "--time-budget must be > 0"),
            (self.max_samples is None or self.max_samples > 0, "--max-samples must be > 0"),
            (
                self.draft_vocab_size is None or self.draft_vocab_size >= 1,
                "--draft-vocab-size must be >= 1",
            ),
            (self.dtype in ("float32", "bfloat16"), "--dtype must be float32 or bfloat16"),
            (
                self.train_argmax in ("auto", "full", "draft"),
                f"--train-argmax must be auto, full or draft, got {self.train_argmax!r}",
            ),
            (
                self.train_argmax != "draft" or self.draft_vocab_size is not None,
                "--train-argmax draft needs --draft-vocab-size",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainingError(message)

    @property
    def state_dir(self) -> str:
        """Resumable training state: the explicit --resume folder, else <out>.train-state."""
        if self.resume and self.resume != "auto":
            return self.resume
        return f"{self.out.rstrip('/')}.train-state"


@dataclass
class EvalConfig:
    """`vllm-clover eval-heads` flags; data fields mean the same as in TrainConfig."""

    target: str = opt("", "target model the heads were trained for", required=True)
    heads: list[str] = opt(
        None, "one or more Clover/Medusa checkpoint folders", nargs="+", required=True
    )
    data: str | None = opt(None, "data file (default: bundled ShareGPT)")
    max_samples: int | None = opt(None, "use only the first N records")
    max_seq_len: int = opt(1024, "truncate sequences to this many tokens")
    eval_fraction: float = opt(
        0.02,
        "held-out fraction (same split as train with the same "
        "--seed); 0 = evaluate on every sequence of --data",
    )
    seed: int = opt(0, "seed of the train/held-out split")
    cache_dir: str | None = opt(None, "hidden-state cache root")
    teacher_batch_tokens: int = opt(8192, "padded tokens per target forward when caching")
    compile_teacher: bool = opt(
        False, "run the target under torch.compile while caching (see train --help)"
    )
    batch_size: int = opt(8, "sequences per evaluation batch")
    device: str = opt("auto", "cpu, cuda, cuda:N or auto")
    json: str | None = opt(None, "also write the metrics as JSON to this file")
    dtype: str = opt(
        "float32",
        "dtype the target caches hidden states in (pass train's --dtype to reuse its cache)",
        choices=("float32", "bfloat16"),
    )
    progress: bool = opt(True, "the progress bar while caching")
    draft_token_cost: float | None = opt(
        None,
        "calibrate per-head draft-confidence thresholds for this price of one verified "
        "draft, in accepted tokens (e.g. 0.1; see docs/heads.md)",
    )
    write_confidence: bool = opt(
        False, "store the calibrated thresholds in each checkpoint's config.json"
    )

    def __post_init__(self) -> None:
        if self.draft_token_cost is not None and self.draft_token_cost < 0:
            raise TrainingError(f"--draft-token-cost must be >= 0, got {self.draft_token_cost}")
        if self.write_confidence and self.draft_token_cost is None:
            raise TrainingError("--write-confidence needs --draft-token-cost")


@dataclass
class GenerateConfig:
    """`vllm-clover generate-data` flags (see training/generate_data.py)."""

    target: str = opt(
        "", "target model (folder, cached HF id or 'smollm2-135m-instruct')", required=True
    )
    out: str = opt("", "output JSONL ({id, messages} per line)", required=True)
    data: str | None = opt(None, "input conversations/prompts (default: bundled ShareGPT)")
    max_samples: int | None = opt(None, "use only the first N records")
    max_turns: int | None = opt(None, "keep at most N assistant turns per conversation")
    max_new_tokens: int = opt(256, "tokens generated per assistant turn")
    temperature: float = opt(0.0, "sampling temperature (0 = greedy)")
    seed: int = opt(0, "sampling seed")
    engine: str = opt(
        "vllm", "vllm (fast) or hf (transformers, no vLLM needed)", choices=("vllm", "hf")
    )
    max_model_len: int = opt(2048, "context length (prompt + reply) of the engine")
    batch_size: int = opt(16, "prompts per generate call (hf engine, padded and static batching)")
    hf_batching: str = opt(
        "padded",
        "hf engine: padded (model.generate on batches of similar prompt length) or "
        "static (Llama-type targets: a KV cache allocated once "
        "per batch, grouped-query attention without copies, finished replies dropped; the "
        "fastest on a GPU)",
        choices=("padded", "static"),
    )
    device: str = opt("auto", "device of the hf engine")
    dtype: str = opt(
        "auto",
        "model dtype: auto (vllm engine: float32 on CPU, the model's on GPU; hf engine: "
        "float32), float32 or bfloat16 (several times faster on CPUs with AMX and on GPUs)",
        choices=("auto", "float32", "bfloat16"),
    )


# Fields whose change does not change the trained weights (allowed to differ on --resume).
RUN_ONLY_FIELDS = (
    "eval_every",
    "save_every",
    "stop_after",
    "time_budget",  # a cut plan is stored with the state, and a resumed run keeps it
    "resume",
    "overwrite",
    "progress",
    "cache_dir",
    "teacher_batch_tokens",
    "compile_teacher",
    "teacher_signal",
    "out",
    "device",
)


@dataclass(frozen=True)
class ExportMedusaConfig:
    """`vllm-clover export-medusa`: heads trained with --medusa, in vLLM's Medusa format."""

    heads: str = opt("", "checkpoint written by train --medusa", required=True)
    target: str = opt("", "the target they were trained for", required=True)
    out: str = opt("", "the folder to write", required=True)
    dtype: str = opt(
        "bfloat16",
        "dtype of the written weights (vLLM casts to the serving dtype)",
        choices=("float32", "bfloat16"),
    )
    overwrite: bool = opt(False, "replace an existing --out folder")
