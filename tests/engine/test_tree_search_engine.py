"""`vllm-clover search-tree` through the real engine: the reference heads draft the candidate
tree on ShareGPT prompts, the verifier's counts become node rates, and the best 4-node tree
is written into the checkpoint's config.json as its default (drafting "default":
test_clover_trees.py)."""

import json
import shutil
from collections import deque

import pytest

from helpers import run_python
from vllm_clover.bundled import REFERENCE_HEADS
from vllm_clover.tree import TokenTree

pytestmark = pytest.mark.engine

SEARCH = """
import sys
from vllm_clover.cli import main
sys.exit(main(["search-tree", "--heads", HEADS, "--prompts", PROMPTS, "--num-prompts", "4",
               "--max-tokens", "24", "--sizes", "2", "4", "--write-default", "4"]))
"""


def test_search_tree_measures_nodes_and_writes_the_best_tree(sharegpt_path, tmp_path):
    heads = tmp_path / "heads"
    shutil.copytree(REFERENCE_HEADS, heads)
    prompts = tmp_path / "prompts.jsonl"
    with sharegpt_path.open() as conversations:
        prompts.write_text("".join(deque(conversations, maxlen=4)))  # the last 4
    before = json.loads((heads / "config.json").read_text())

    code = SEARCH.replace("HEADS", repr(str(heads))).replace("PROMPTS", repr(str(prompts)))
    output = run_python(code, timeout=600)
    report = json.loads((heads / "tree_search.json").read_text())

    search, trees = report["search"], report["trees"]
    assert report["count"] == 4
    assert search["verified"] > 0  # the engine drafted and verified the candidate tree
    assert len(search["chances"]) == TokenTree.parse(search["candidate"]).num_nodes
    assert all(0.0 <= p <= 1.0 for p in search["chances"])
    assert max(search["chances"]) > 0  # drafts were accepted
    chain, best = trees["chain"]["predicted_tau"], trees["tree-4"]["predicted_tau"]
    assert 1.0 < chain <= best  # the 4-deep chain is one of the 4-node subtrees
    assert "tree-4" in output and "predicted tau" in output
    after = json.loads((heads / "config.json").read_text())
    assert after == {**before, "token_tree": trees["tree-4"]["tree"]}
    assert TokenTree.parse(after["token_tree"]).num_nodes == 4
