"""`vllm-clover search-tree`: which token tree to draft, measured through vLLM. The heads draft
a wide candidate tree (``CANDIDATE``) and the best N-node subtree is the N most accepted
nodes; ``--write-default N`` records it as the heads' ``token_tree``. How it works:
docs/design/engine-layer.md, "Searching a token tree"."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_clover.bench.config import BenchError
from vllm_clover.training.flags import opt

if TYPE_CHECKING:
    from vllm_clover.tree import TokenTree

CANDIDATE = (
    [(r,) for r in range(12)]
    + [(a, r) for a in range(6) for r in range(6)]
    + [(a, b, r) for a in range(3) for b in range(3) for r in range(3)]
    + [(a, 0, 0, r) for a in range(2) for r in range(2)]
)


DEFAULT_SIZES = (4, 8, 12, 16)


@dataclass(frozen=True)
class TreeSearchConfig:
    """The command's flags (one per field, ``training/flags.py``)."""

    heads: str = opt("", "Clover checkpoint folder whose trees are searched", required=True)
    prompts: str = opt(
        "",
        "prompts of the workload (JSONL/JSON as bench --prompts reads): never the test set "
        "the chosen tree is then judged on",
        required=True,
    )
    target: str = opt("smollm2-135m-instruct", "target model (folder, HF id or the reference)")
    sizes: list[int] | None = opt(None, "tree sizes to report (default: 4 8 12 16)", nargs="+")
    num_prompts: int = opt(40, "prompts decoded (cycled if the file holds fewer)")
    max_tokens: int = opt(64, "new tokens per prompt")
    write_default: int | None = opt(
        None,
        "record the best tree of this size (one of --sizes) as the checkpoint's default token_tree",
    )
    out: str | None = opt(None, "report JSON (default: <heads>/tree_search.json)")

    def __post_init__(self) -> None:
        from vllm_clover.modeling.checkpoint import CloverCheckpointError, read_config_json

        try:
            read_config_json(self.heads)
        except CloverCheckpointError as err:
            raise BenchError(f"--heads {self.heads}: no Clover checkpoint there ({err})") from err
        if min(self.tree_sizes) < 1 or self.num_prompts < 1 or self.max_tokens < 1:
            raise BenchError("--sizes, --num-prompts and --max-tokens must be >= 1")
        if self.write_default is not None and self.write_default not in self.tree_sizes:
            raise BenchError(f"--write-default {self.write_default} must be one of --sizes")

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        return tuple(self.sizes or DEFAULT_SIZES)


def candidate_tree(num_heads: int):
    """The candidate tree cut to paths the heads can draft (depth <= num_heads)."""
    from vllm_clover.tree import TokenTree

    return TokenTree.from_paths([p for p in CANDIDATE if len(p) <= num_heads])


def node_chances(target: str, heads: Path, tree, prompts: list, max_tokens: int) -> dict:
    """Decode `prompts` (token prompts) greedily drafting `tree`: verified trees, each node's
    acceptance rate."""
    from vllm import SamplingParams

    from vllm_clover.bench.measure import engine
    from vllm_clover.patches.channel import RunnerChannel, channel_of

    def counts(worker) -> tuple[int, tuple[int, ...]]:
        trees = channel_of(worker.model_runner, RunnerChannel).trees
        return trees.verified, tuple(trees.accepted_by_node)

    spec = {"method": "clover", "model": str(heads), "speculative_token_tree": str(tree)}
    with engine(target, spec, 4) as llm:
        greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
        llm.generate(prompts, greedy, use_tqdm=False)
        ((verified, accepted),) = set(llm.collective_rpc(counts))
    if not verified:
        raise BenchError("no tree was verified: the prompts produced no decoding step")
    return {
        "candidate": str(tree),
        "verified": verified,
        "chances": [a / verified for a in accepted],
    }


def best_subtree(tree: TokenTree, chances: Sequence[float], num_nodes: int) -> TokenTree:
    """The ``num_nodes`` nodes of ``tree`` most often accepted, as measured: ``chances[i]``
    is how often node i was accepted when the whole tree was verified. A child is never
    accepted without its parent, so the best nodes form a tree.
    Example: chances (0.4, 0.2, 0.12) for [(0,), (1,), (0, 0)] and 2 nodes: [(0,), (1,)]."""
    from vllm_clover.tree import TokenTree

    order = sorted(range(tree.num_nodes), key=lambda i: (-chances[i], tree.depths[i], i))
    chosen = set(order[:num_nodes])
    for i in chosen:  # ties at zero may pick a child without its parent: keep parents first
        parent = tree.parents[i]
        if parent >= 0 and parent not in chosen:
            raise ValueError(
                f"node {tree.paths[i]} chosen without its parent: chances not measured on one tree"
            )
    return TokenTree.from_paths([tree.paths[i] for i in sorted(chosen)])


def best_trees(found: dict, sizes: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """The chain's and each size's best subtree, with predicted tau (1 + their nodes' rates)."""
    from vllm_clover.tree import TokenTree

    tree, chances = TokenTree.parse(found["candidate"]), found["chances"]
    index = {p: i for i, p in enumerate(tree.paths)}
    chain = [i for p, i in index.items() if all(r == 0 for r in p)]
    out = {"chain": {"tree": None, "predicted_tau": 1 + sum(chances[i] for i in chain)}}
    for size in sizes:
        sub = best_subtree(tree, chances, min(size, tree.num_nodes))
        tau = 1 + sum(chances[index[p]] for p in sub.paths)
        out[f"tree-{size}"] = {"tree": str(sub), "predicted_tau": tau}
    return out


def search_tree(cfg: TreeSearchConfig) -> dict[str, Any]:
    """Run the search, print and write its report, and the default tree if asked."""
    from vllm_clover.bench.check import fitting_prompts
    from vllm_clover.bench.prompts import load_prompts, take_prompts
    from vllm_clover.modeling.checkpoint import load_clover_config, set_config_field

    folder, target = Path(cfg.heads), target_path(cfg.target)
    fitting = fitting_prompts(target, load_prompts(cfg.prompts), cfg.max_tokens)
    if not fitting:
        raise BenchError(f"--prompts: none leaves {cfg.max_tokens} tokens of the context")
    prompts = take_prompts(fitting, cfg.num_prompts)
    tree = candidate_tree(load_clover_config(folder).num_heads)
    found = node_chances(target, folder, tree, prompts, cfg.max_tokens)
    trees = best_trees(found, cfg.tree_sizes)
    for name, entry in trees.items():
        print(f"{name:8} predicted tau {entry['predicted_tau']:.3f}  {entry['tree'] or ''}")
    report = {"search": found, "trees": trees, "prompts": str(cfg.prompts), "count": len(prompts)}
    Path(cfg.out or folder / "tree_search.json").write_text(json.dumps(report, indent=1) + "\n")
    if cfg.write_default is not None:
        set_config_field(folder, "token_tree", trees[f"tree-{cfg.write_default}"]["tree"])
    return report


def target_path(target: str) -> str:
    """The reference target's folder (fetched on first use), or a folder or HF id as given."""
    from vllm_clover.assets.target import REFERENCE_TARGET, fetch_reference_target

    return str(fetch_reference_target()) if target == REFERENCE_TARGET else target
