"""Which token tree to draft: measure every node of a wide candidate tree, keep the best
subtree of each size.

The reference target decodes MT-Bench first turns greedily while the reference heads draft
a wide candidate tree (``CANDIDATE``: 12 ranks at depth 1, 6 x 6 at depth 2, 27 nodes at
depth 3, 4 at depth 4). The verifier counts how often each node was accepted. A node's
greedy acceptance depends on its own path only, so that rate holds in every subtree that
keeps the path, and the best subtree of N nodes is the N most accepted ones
(``tree.design.best_subtree``); its predicted tau is 1 + the sum of their rates. The chain's
(the four rank-0 nodes) is read off the same run. Timing a chosen tree against the chain
is ``vllm-clover bench --clover-variant tree='{"speculative_token_tree": "TREE"}'``.

    python benchmarks/tree_search.py --sizes 4 8 12 16 24 --search-prompts 40 \
        --out docs/bench/trees

``--write-default N`` records the best N-node tree in the heads' config.json (``token_tree``),
which ``"speculative_token_tree": "default"`` then drafts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_clover.bench.measure import engine
from vllm_clover.bench.prompts import load_prompts, take_prompts
from vllm_clover.bundled import REFERENCE_HEADS
from vllm_clover.tree import TokenTree
from vllm_clover.tree.design import best_subtree

CANDIDATE = (
    [(r,) for r in range(12)]
    + [(a, r) for a in range(6) for r in range(6)]
    + [(a, b, r) for a in range(3) for b in range(3) for r in range(3)]
    + [(a, 0, 0, r) for a in range(2) for r in range(2)]
)


def tree_counts(worker) -> tuple:
    trees = worker.model_runner.clover_trees
    return trees.verified, tuple(trees.accepted_by_node)


def search(target: Path, heads: Path, prompts: list, max_tokens: int) -> dict:
    """Acceptance rate of every candidate node, and the best subtrees."""
    from vllm import SamplingParams

    tree = TokenTree.from_paths(CANDIDATE)
    spec = {"method": "clover", "model": str(heads), "speculative_token_tree": str(tree)}
    with engine(target, spec, 4) as llm:
        llm.chat(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
        ((verified, accepted),) = set(llm.collective_rpc(tree_counts))
    chances = [a / verified for a in accepted]
    return {"candidate": str(tree), "verified": verified, "chances": chances}


def best_trees(found: dict, sizes: list[int]) -> dict[str, dict]:
    tree = TokenTree.parse(found["candidate"])
    chances = found["chances"]
    chain = [i for i, p in enumerate(tree.paths) if all(r == 0 for r in p)]
    out = {"chain-4": {"tree": None, "predicted_tau": 1 + sum(chances[i] for i in chain)}}
    for size in sizes:
        sub = best_subtree(tree, chances, size)
        index = {p: i for i, p in enumerate(tree.paths)}
        tau = 1 + sum(chances[index[p]] for p in sub.paths)
        out[f"tree-{size}"] = {"tree": str(sub), "predicted_tau": tau}
    return out


def write_default(heads: Path, tree: str) -> None:
    """Record ``tree`` as the checkpoint's default (config.json ``token_tree``), keeping the
    file's other fields; the config is validated before the file is written."""
    from vllm_clover.modeling.config import CloverConfig

    path = heads / "config.json"
    config = json.loads(path.read_text())
    config["token_tree"] = tree
    CloverConfig.from_dict(config)  # ValueError naming the problem, the file untouched
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 12, 16])
    parser.add_argument("--search-prompts", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--heads", type=Path, default=REFERENCE_HEADS)
    parser.add_argument("--write-default", type=int, metavar="N", help="record tree-N as default")
    parser.add_argument("--out", type=Path, default=Path("docs/bench/trees"))
    args = parser.parse_args()
    if args.write_default is not None and args.write_default not in args.sizes:
        parser.error(f"--write-default {args.write_default} must be one of --sizes")
    from vllm_clover.assets.target import fetch_reference_target

    target, chats = fetch_reference_target(), load_prompts()
    found = search(target, args.heads, take_prompts(chats, args.search_prompts), args.max_tokens)
    trees = best_trees(found, args.sizes)
    for name, entry in trees.items():
        print(f"{name:8} predicted tau {entry['predicted_tau']:.3f}  {entry['tree']}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "search": found,
        "trees": trees,
        "args": vars(args) | {"out": str(args.out), "heads": str(args.heads)},
    }
    (args.out / "tree_search.json").write_text(json.dumps(report, indent=1))
    if args.write_default is not None:
        write_default(args.heads, trees[f"tree-{args.write_default}"]["tree"])


if __name__ == "__main__":
    main()
