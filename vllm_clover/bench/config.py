"""Options of `vllm-clover bench`: one typed dataclass, validated before any engine starts.

Every problem a user can cause (an unknown method, a missing or wrong checkpoint, a bad
batch size) is a `BenchError` naming it, raised here, so no engine start is wasted on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STANDARD_METHODS = ("vanilla", "ngram", "medusa", "clover")
# Prompt lookup: match the last 2..4 tokens against the context (vLLM's default is 5..5).
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
# How the engine runs: in this process, or with vLLM's separate engine-core process (what
# `LLM(...)` and `vllm serve` give users by default).
ENGINE_MODES = ("in-process", "multiprocess")
# How a Clover engine picks each step's K (speculative_config draft_budget); the first is the
# default. A Clover method runs once per budget asked for, the others named NAME-<budget>.
# "floor" is no budget a user would pick: vLLM's batch-size table at K = 0 for every batch,
# the speculative engine drafting nothing, the floor the goodput budget cannot go below.
DRAFT_BUDGETS = ("goodput", "fixed", "floor")
FLOOR_SCHEDULE = ((1, 1 << 20, 0),)  # num_speculative_tokens_per_batch_size: K = 0, any batch
# How a Clover chain's drafts are chosen at T > 0 (speculative_config draft_sample_method):
# drawn from the heads' distributions ("probabilistic", Clover's default: nothing passed), or
# the argmax ("greedy", passed, named NAME-greedy).
DRAFT_SAMPLINGS = ("probabilistic", "greedy")
DTYPES = ("float32", "bfloat16")
# Whether answers stop at the end-of-sequence token (--ignore-eos). At T > 0 a method's answer
# lengths are random, so runs that stop at EOS time different amounts of work and their
# tokens/s differ by chance; "auto" runs every answer to max_tokens at T > 0 only (at T = 0
# every method gives vanilla's answers, EOS included).
EOS_POLICIES = ("auto", "always", "never")
# The evaluation protocol (docs/benchmarks.md), and a few-minute version of it for 2 cores.
FULL_PRESET = {
    "batch_sizes": (1, 4, 16, 64),
    "temperatures": (0.0, 1.0),
    "max_tokens": 128,
    "min_prompts": 16,
    "prompts_per_seq": 2,
    "repeats": 3,
    "engines": ENGINE_MODES,
}
QUICK_PRESET = {
    "batch_sizes": (1, 4),
    "temperatures": (0.0,),
    "max_tokens": 32,
    "min_prompts": 8,
    "prompts_per_seq": 2,
    "repeats": 1,
    "engines": ("in-process",),
}


class BenchError(ValueError):
    """Bad benchmark input (or a failed engine run), with a message naming the problem."""


@dataclass(frozen=True)
class Method:
    """One decoding method: a name for the tables, vLLM's method and its K."""

    name: str
    kind: str  # "vanilla" | "ngram" | "medusa" | "clover"
    model: str | None = None
    num_speculative_tokens: int = 0
    options: tuple[tuple[str, Any], ...] = ()  # more speculative_config keys

    def speculative_config(self) -> dict[str, Any] | None:
        """The `speculative_config` for `vllm.LLM` (None: plain decoding)."""
        if self.kind == "vanilla":
            return None
        spec: dict[str, Any] = {
            "method": self.kind,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.kind == "ngram":
            return {**spec, **NGRAM_LOOKUP}
        return {**spec, "model": self.model, **dict(self.options)}


@dataclass(frozen=True)
class BenchConfig:
    """Everything one `vllm-clover bench` invocation measures."""

    methods: tuple[Method, ...]
    batch_sizes: tuple[int, ...] = FULL_PRESET["batch_sizes"]
    temperatures: tuple[float, ...] = FULL_PRESET["temperatures"]
    max_tokens: int = FULL_PRESET["max_tokens"]
    min_prompts: int = FULL_PRESET["min_prompts"]
    prompts_per_seq: int = FULL_PRESET["prompts_per_seq"]  # prompts >= this x batch size
    repeats: int = FULL_PRESET["repeats"]  # rounds; each runs every engine once, in turn
    engines: tuple[str, ...] = FULL_PRESET["engines"]  # ENGINE_MODES measured
    dtype: str = "float32"  # the target's: float32 (where greedy equality is exact) or bfloat16
    compiled: bool = False  # vLLM's torch.compile mode for the target, as `vllm serve` runs it
    ignore_eos: str = "auto"  # EOS_POLICIES
    # Rerun vanilla where a T = 0 output parted from it, to tell rounding ties from bugs
    tie_check: bool = True
    prompts_file: str | None = None  # None: MT-Bench first turns
    out: Path = Path("bench-results")
    cache_dir: str | None = None
    quick: bool = False
    plots: bool = True

    def __post_init__(self) -> None:
        validate(self)

    def num_prompts(self, batch_size: int) -> int:
        """Prompts per run at `batch_size`: enough to keep the batch full most of the time."""
        return max(self.min_prompts, self.prompts_per_seq * batch_size)


def validate(config: BenchConfig) -> None:
    """Raise BenchError for values no run could use."""
    if not config.methods or config.methods[0].kind != "vanilla":
        raise BenchError("the first method must be vanilla (the baseline of every ratio)")
    names = [m.name for m in config.methods]
    if len(set(names)) != len(names):
        raise BenchError(f"method names must be unique, got {names}")
    if not config.batch_sizes or min(config.batch_sizes) < 1:
        raise BenchError(f"batch sizes must be >= 1, got {list(config.batch_sizes)}")
    if not config.temperatures or min(config.temperatures) < 0:
        raise BenchError(f"temperatures must be >= 0, got {list(config.temperatures)}")
    unknown = [e for e in config.engines if e not in ENGINE_MODES]
    if not config.engines or unknown or len(set(config.engines)) != len(config.engines):
        raise BenchError(
            f"--engines must be distinct values among {', '.join(ENGINE_MODES)}, "
            f"got {list(config.engines)}"
        )
    if config.dtype not in DTYPES:
        raise BenchError(f"--dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    if config.ignore_eos not in EOS_POLICIES:
        raise BenchError(
            f"--ignore-eos must be one of {', '.join(EOS_POLICIES)}, got {config.ignore_eos!r}"
        )
    for name in ("max_tokens", "min_prompts", "prompts_per_seq", "repeats"):
        if getattr(config, name) < 1:
            raise BenchError(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}"
            )


def ignores_eos(policy: str, temperature: float) -> bool:
    """Whether a run at `temperature` under --ignore-eos `policy` generates past EOS.
    Example: "auto" -> False at T = 0, True at T = 0.7 and T = 1."""
    return policy == "always" or (policy == "auto" and temperature > 0)


def checkpoint_heads(path: str | Path, model_type: str, label: str) -> int:
    """Number of heads of the `model_type` checkpoint at `path` (BenchError if unusable)."""
    from vllm_clover.modeling.checkpoint import CloverCheckpointError, read_config_json

    try:
        config = read_config_json(path, model_type)
    except CloverCheckpointError as err:
        raise BenchError(f"{label}: {err}") from err
    heads = config.get("num_heads")
    if not isinstance(heads, int) or heads < 1:
        raise BenchError(
            f"{label}: {Path(path) / 'config.json'} has no valid num_heads ({heads!r})"
        )
    return heads


def parse_named_dir(text: str) -> tuple[str, str]:
    """'NAME=DIR' -> (NAME, DIR)."""
    name, sep, folder = text.partition("=")
    if not sep or not name.strip() or not folder.strip():
        raise BenchError(f"--clover expects NAME=DIR, got {text!r}")
    return name.strip(), folder.strip()


def resolve_methods(
    names: list[str],
    clover_heads: str,
    medusa_heads: str,
    ngram_tokens: int,
    extra_clover: list[str],
    draft_budgets: tuple[str, ...] = DRAFT_BUDGETS[:1],
    trees: tuple[str, ...] = (),
    tree_confidences: tuple[float | str, ...] = (0.0,),
    draft_samplings: tuple[str, ...] = DRAFT_SAMPLINGS[:1],
    variants: tuple[str, ...] = (),
) -> tuple[Method, ...]:
    """Methods to run, vanilla first; checkpoints are checked here, not at engine start.

    Each Clover checkpoint runs once per draft budget and draft sampling: ("goodput",
    "fixed") x ("probabilistic", "greedy") gives "clover", "clover-greedy", "clover-fixed"
    and "clover-fixed-greedy". Each token tree runs the --clover-heads checkpoint once per tree
    confidence: "clover-tree<nodes>" (0: the whole tree), "clover-tree<nodes>-c<C>"
    (``draft_confidence`` C: each request drafts the nodes of path probability >= C) and
    "clover-tree<nodes>-goodput" (``draft_budget`` "goodput": the threshold chosen per step).
    A variant "NAME={json}" runs the --clover-heads checkpoint with those speculative_config
    keys (an engine A/B: '{"draft_budget": "fixed", "num_speculative_tokens": 2}').
    """
    unknown = [n for n in names if n not in STANDARD_METHODS]
    if unknown:
        raise BenchError(
            f"unknown method(s) {', '.join(map(repr, unknown))}: choose from "
            f"{', '.join(STANDARD_METHODS)} (add Clover checkpoints with "
            f"--clover NAME=DIR)"
        )
    if ngram_tokens < 1:
        raise BenchError(f"--ngram-tokens must be >= 1, got {ngram_tokens}")
    methods = [Method("vanilla", "vanilla")]
    for name in dict.fromkeys(names):
        if name == "ngram":
            methods.append(Method("ngram", "ngram", None, ngram_tokens))
        elif name == "medusa":
            k = checkpoint_heads(medusa_heads, name, name)
            methods.append(Method(name, name, str(Path(medusa_heads).resolve()), k))
        elif name == "clover":
            methods += _clover_methods(name, clover_heads, "clover", draft_budgets, draft_samplings)
    for text in extra_clover:
        name, folder = parse_named_dir(text)
        methods += _clover_methods(name, folder, f"--clover {name}", draft_budgets, draft_samplings)
    bad = [c for c in tree_confidences if c != "goodput" and not 0.0 <= float(c) <= 1.0]
    if bad or not tree_confidences:
        raise BenchError(f"--tree-confidence {bad}: path probabilities in [0, 1], or goodput")
    for text in trees:
        methods += [_tree_method(text, clover_heads, c) for c in dict.fromkeys(tree_confidences)]
    methods += [_variant_method(text, clover_heads) for text in variants]
    names = [m.name for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BenchError(f"two methods are named {', '.join(repeated)}: name them apart")
    return tuple(methods)


def _variant_method(text: str, folder: str) -> Method:
    """--clover-variant NAME={json}: the Clover checkpoint with more speculative_config keys."""
    name, _, options = text.partition("=")
    try:
        keys = json.loads(options)
    except json.JSONDecodeError as err:
        raise BenchError(f"--clover-variant {name}: not JSON ({err}): {options!r}") from None
    if not name.strip() or not isinstance(keys, dict):
        raise BenchError(f'--clover-variant expects NAME={{"key": value, ...}}, got {text!r}')
    k = keys.pop("num_speculative_tokens", None) or checkpoint_heads(folder, "clover", name)
    options = tuple((key, _frozen(value)) for key, value in keys.items())
    return Method(name.strip(), "clover", str(Path(folder).resolve()), k, options)


def _frozen(value: Any) -> Any:
    """JSON lists as tuples, nested ones too (a Method's options are hashable)."""
    return tuple(map(_frozen, value)) if isinstance(value, list) else value


def _tree_method(text: str, folder: str, confidence: float | str) -> Method:
    """The Clover checkpoint drafting the token tree ``text`` ("[(0,), (1,), (0, 0)]"),
    pruned per request at path probability ``confidence`` (0: the whole tree; "goodput":
    chosen per step)."""
    from vllm_clover.tree import TokenTree, TokenTreeError

    try:
        tree = TokenTree.parse(text)
        tree.check_fits(checkpoint_heads(folder, "clover", "--tree"), 1 << 30)
    except TokenTreeError as err:
        raise BenchError(f"--tree: {err}") from None
    name, options = f"clover-tree{tree.num_nodes}", (("speculative_token_tree", str(tree)),)
    if confidence == "goodput":
        name, options = f"{name}-goodput", (*options, ("draft_budget", "goodput"))
    elif confidence > 0:
        name, options = f"{name}-c{confidence:g}", (*options, ("draft_confidence", confidence))
    path = str(Path(folder).resolve())
    return Method(name, "clover", path, tree.num_nodes, options)


def _clover_methods(
    name: str,
    folder: str,
    label: str,
    draft_budgets: tuple[str, ...],
    draft_samplings: tuple[str, ...] = DRAFT_SAMPLINGS[:1],
) -> list[Method]:
    """One Method per draft budget and draft sampling of a Clover checkpoint."""
    for flag, given, known in (
        ("--draft-budgets", draft_budgets, DRAFT_BUDGETS),
        ("--draft-sampling", draft_samplings, DRAFT_SAMPLINGS),
    ):
        unknown = [b for b in given if b not in known]
        if unknown or not given:
            raise BenchError(f"{flag} {unknown}: choose from {', '.join(known)}")
    k = checkpoint_heads(folder, "clover", label)
    return [
        Method(
            name
            + ("" if budget == DRAFT_BUDGETS[0] else f"-{budget}")
            + ("" if sampling == DRAFT_SAMPLINGS[0] else f"-{sampling}"),
            "clover",
            str(Path(folder).resolve()),
            k,
            _budget_options(budget)
            + (() if sampling == DRAFT_SAMPLINGS[0] else (("draft_sample_method", sampling),)),
        )
        for budget in dict.fromkeys(draft_budgets)
        for sampling in dict.fromkeys(draft_samplings)
    ]


def _budget_options(budget: str) -> tuple[tuple[str, Any], ...]:
    """The speculative_config keys of a --draft-budgets value ("floor": vLLM's own batch-size
    table, K = 0 for every batch size, which implies draft_budget "fixed")."""
    if budget == "floor":
        return (
            ("draft_budget", "fixed"),
            ("num_speculative_tokens_per_batch_size", FLOOR_SCHEDULE),
        )
    return (("draft_budget", budget),)
