"""`vllm-clover search-tree` without an engine: its flags' checks, the candidate tree cut to
the heads' depth, the best subtrees and their predicted tau (writing the default tree:
test_checkpoint.py). Through the real engine: tests/engine/test_tree_search_engine.py."""

from __future__ import annotations

import json

import pytest

from vllm_clover.bench.config import BenchError
from vllm_clover.bench.tree_search import (
    CANDIDATE,
    TreeSearchConfig,
    best_trees,
    candidate_tree,
)
from vllm_clover.bundled import REFERENCE_HEADS
from vllm_clover.cli import main
from vllm_clover.tree import TokenTree

pytestmark = pytest.mark.unit


def test_bad_flags_are_named_before_any_engine(tmp_path, capsys):
    with pytest.raises(BenchError, match="no Clover checkpoint"):
        TreeSearchConfig(heads=str(tmp_path), prompts="p.jsonl")
    with pytest.raises(BenchError, match="--write-default 6 must be one of --sizes"):
        TreeSearchConfig(heads=str(REFERENCE_HEADS), prompts="p.jsonl", write_default=6)
    args = ["search-tree", "--heads", str(REFERENCE_HEADS), "--prompts", "p.jsonl"]
    assert main([*args, "--sizes", "0"]) == 2
    assert "--sizes, --num-prompts and --max-tokens must be >= 1" in capsys.readouterr().err


def test_the_candidate_is_cut_to_the_heads_depth():
    assert candidate_tree(4).num_nodes == len(CANDIDATE) == 79
    shallow = candidate_tree(2)
    assert shallow.num_nodes == 12 + 36
    assert max(map(len, shallow.paths)) == 2


def test_best_trees_sum_their_nodes_rates_and_beat_the_chain():
    tree = TokenTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    chances = [0.5, 0.3, 0.25, 0.2, 0.1, 0.05]  # node i's acceptance rate
    trees = best_trees({"candidate": str(tree), "chances": chances}, (2, 3, 9))
    assert trees["chain"]["predicted_tau"] == pytest.approx(1 + 0.5 + 0.25 + 0.05)
    assert TokenTree.parse(trees["tree-2"]["tree"]).paths == ((0,), (1,))
    assert trees["tree-3"]["predicted_tau"] == pytest.approx(1 + 0.5 + 0.3 + 0.25)
    assert trees["tree-9"]["predicted_tau"] == pytest.approx(1 + sum(chances))  # all 6 nodes


def test_prompts_that_leave_no_room_to_decode_are_named(reference_target, tmp_path, capsys):
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "word " * 3000}) + "\n")  # past the 2,048 context
    args = ["search-tree", "--heads", str(REFERENCE_HEADS), "--prompts", str(prompts)]
    assert main(args) == 2
    assert "--prompts: none leaves 64 tokens of the context" in capsys.readouterr().err


def test_best_subtree_keeps_the_most_accepted_nodes():
    from vllm_clover.bench.tree_search import best_subtree
    from vllm_clover.tree import TokenTree

    tree = TokenTree.parse("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]")
    chances = [0.4, 0.2, 0.05, 0.12, 0.06, 0.03]
    assert str(best_subtree(tree, chances, 2)) == "[(0,), (1,)]"
    assert str(best_subtree(tree, chances, 4)) == "[(0,), (1,), (0, 0), (1, 0)]"
    assert best_subtree(tree, chances, 6) == tree
    zero = [0.4, 0.0, 0.0, 0.0, 0.0, 0.0]  # ties at zero: parents before children
    assert str(best_subtree(tree, zero, 3)) == "[(0,), (1,), (2,)]"
