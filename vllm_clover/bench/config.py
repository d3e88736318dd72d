"""Options of `vllm-clover bench`: one typed dataclass, validated before any engine starts
(every problem a user can cause is a `BenchError` naming it)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_clover.tree import TokenTree

STANDARD_METHODS = ("vanilla", "ngram", "medusa", "eagle3", "clover")
DEFAULT_METHODS = ("vanilla", "ngram", "medusa", "clover")  # eagle3 needs --eagle3-drafter
# Prompt lookup: match the last 2..4 tokens against the context (vLLM's default is 5..5).
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
# How the engine runs: in this process, or with vLLM's separate engine-core process (what
# `LLM(...)` and `vllm serve` give users by default).
ENGINE_MODES = ("in-process", "multiprocess")
DTYPES = ("float32", "bfloat16")
# Whether answers stop at the end-of-sequence token (--ignore-eos); "auto": past it at T > 0
# only, where random answer lengths would time different amounts of work.
EOS_POLICIES = ("auto", "always", "never")
# The evaluation protocol (docs/history/benchmarks-2026-11.md), and a few-minute version of it.
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
    kind: str  # "vanilla" | "ngram" | "medusa" | "eagle3" | "clover"
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
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BenchError(f"two methods are named {', '.join(repeated)}: name them apart")
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


def eagle3_tokens(path: str | None) -> int:
    """K of the EAGLE-3 drafter at ``path`` (speculators format: the draft tokens of its
    proposal method), BenchError if it is not one."""
    from vllm_clover.modeling.checkpoint import CloverCheckpointError, read_config_json

    if not path:
        raise BenchError("method eagle3 needs --eagle3-drafter DIR (vllm-clover train-eagle3)")
    try:
        config = read_config_json(path, model_type=None)
    except CloverCheckpointError as err:
        raise BenchError(f"--eagle3-drafter: {err}") from err
    proposals = config.get("speculators_config", {}).get("proposal_methods") or [{}]
    k = proposals[0].get("speculative_tokens")
    if config.get("speculators_model_type") != "eagle3" or not isinstance(k, int) or k < 1:
        raise BenchError(
            f"--eagle3-drafter: {path} is not an EAGLE-3 drafter in the speculators format "
            "(config.json needs speculators_model_type eagle3 and its speculative_tokens)"
        )
    return k


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
    variants: tuple[str, ...] = (),
    eagle3_drafter: str | None = None,
) -> tuple[Method, ...]:
    """Methods to run, vanilla first; checkpoints are checked here, not at engine start.
    Clover methods run with Clover's defaults; each variant "NAME={json}" is a method of its
    own (`_variant`)."""
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
        elif name == "eagle3":
            k = eagle3_tokens(eagle3_drafter)
            methods.append(Method(name, name, str(Path(eagle3_drafter).resolve()), k))
        elif name == "clover":
            methods.append(_clover(name, clover_heads, "clover"))
    for text in extra_clover:
        name, folder = parse_named_dir(text)
        methods.append(_clover(name, folder, f"--clover {name}"))
    methods += [_variant(text, clover_heads) for text in variants]
    return tuple(methods)  # BenchConfig refuses two methods of one name


def _clover(
    name: str, folder: str, label: str, k: int | None = None, options: list | tuple = ()
) -> Method:
    """A Clover checkpoint's method: K its heads unless given, more speculative_config keys."""
    heads = checkpoint_heads(folder, "clover", label)
    return Method(name, "clover", str(Path(folder).resolve()), k or heads, tuple(options))


def _variant(text: str, clover_heads: str) -> Method:
    """--clover-variant NAME={json}: a Clover checkpoint with more speculative_config keys,
    checked as far as no engine is needed, e.g. '{"draft_budget": "fixed"}' (more examples:
    docs/design/engine-layer.md, "Options")."""
    name, sep, options = (part.strip() for part in text.partition("="))
    label = f"--clover-variant {name}"
    try:
        keys = json.loads(options) if sep and name else None
    except json.JSONDecodeError as err:
        raise BenchError(f"{label}: not JSON ({err}): {options!r}") from None
    if not isinstance(keys, dict):
        raise BenchError(f'--clover-variant expects NAME={{"key": value, ...}}, got {text!r}')
    keys = _check_keys(label, keys)
    k = keys.pop("num_speculative_tokens", None)
    folder = keys.pop("model", None) or clover_heads
    heads = checkpoint_heads(folder, "clover", label)
    if keys.get("speculative_token_tree") is not None:
        tree = _variant_tree(label, keys["speculative_token_tree"], folder, heads)
        if k not in (None, tree.num_nodes):
            raise BenchError(
                f"{label}: num_speculative_tokens={k} but speculative_token_tree has "
                f"{tree.num_nodes} nodes (drop num_speculative_tokens: a tree sets it)"
            )
        keys["speculative_token_tree"], k = str(tree), tree.num_nodes
    elif k is not None and not 1 <= k <= heads:
        raise BenchError(f"{label}: num_speculative_tokens={k}: {folder} has {heads} heads")
    options = [(key, _frozen(value)) for key, value in keys.items()]
    return _clover(name, folder, label, k, options)


def _check_keys(label: str, keys: dict[str, Any]) -> dict[str, Any]:
    """`keys` as vLLM's SpeculativeConfig reads them (num_speculative_tokens 2.0 -> 2);
    BenchError for a key it lacks (Clover's own keys included), or a value of a type it
    refuses (an engine checks the rest when it starts)."""
    from pydantic import TypeAdapter, ValidationError
    from vllm.config.speculative import SpeculativeConfig

    from vllm_clover.patches.method import CLOVER_FIELDS

    types = {key: field.annotation for key, field in SpeculativeConfig.__pydantic_fields__.items()}
    types.update((key, annotation) for key, (annotation, _) in CLOVER_FIELDS.items())
    if "method" in keys:
        raise BenchError(f'{label}: a variant\'s "method" is clover; drop "method"')
    unknown = [key for key in keys if key not in types]
    if unknown:
        near = [m for key in unknown for m in difflib.get_close_matches(key, types, 1)]
        raise BenchError(
            f"{label}: unknown speculative_config key(s) {', '.join(map(repr, unknown))}"
            + (f" (did you mean {', '.join(near)}?)" if near else "")
            + f"; known: vLLM's SpeculativeConfig fields and Clover's {', '.join(CLOVER_FIELDS)}"
        )
    checked = {}
    for key, value in keys.items():
        try:
            checked[key] = TypeAdapter(types[key]).validate_python(value)
        except ValidationError as err:
            problem = err.errors()[0]["msg"]
            raise BenchError(f"{label}: {key} {json.dumps(value)}: {problem}") from None
    return checked


def _variant_tree(label: str, text: str, folder: str, heads: int) -> TokenTree:
    """The TokenTree a variant drafts ("default": the checkpoint's own ``token_tree``)."""
    from vllm_clover.modeling.checkpoint import read_config_json
    from vllm_clover.tree import TokenTree, TokenTreeError

    if text == "default":
        text = read_config_json(folder, "clover").get("token_tree")
        if text is None:
            raise BenchError(
                f'{label}: speculative_token_tree "default": {folder} records no token_tree '
                "(vllm-clover search-tree --write-default writes one)"
            )
    try:
        tree = TokenTree.parse(text)
        tree.check_fits(heads, 1 << 30)
    except TokenTreeError as err:
        raise BenchError(f"{label}: speculative_token_tree: {err}") from None
    return tree


def _frozen(value: Any) -> Any:
    """JSON lists as tuples, nested ones too (a Method's options are hashable)."""
    return tuple(map(_frozen, value)) if isinstance(value, list) else value
