"""`vllm-clover bench`: methods, draft budgets, trees, options and bad input."""

from __future__ import annotations

import json

import pytest

from vllm_clover.bench.config import (
    QUICK_PRESET,
    BenchConfig,
    BenchError,
    Method,
    checkpoint_heads,
    ignores_eos,
    parse_named_dir,
    resolve_methods,
)
from vllm_clover.bundled import REFERENCE_HEADS, REFERENCE_MEDUSA
from vllm_clover.cli import build_parser, main

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)


# ------------------------------------------------------------------ options
def test_methods_and_their_speculative_configs():
    methods = resolve_methods(
        ["clover", "ngram", "medusa", "clover"],
        str(REFERENCE_HEADS),
        str(REFERENCE_MEDUSA),
        3,
        [f"ablation={REFERENCE_HEADS}"],
    )
    assert [m.name for m in methods] == ["vanilla", "clover", "ngram", "medusa", "ablation"]
    by_name = {m.name: m for m in methods}
    assert by_name["vanilla"].speculative_config() is None
    assert by_name["ngram"].speculative_config() == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    medusa_heads = json.loads((REFERENCE_MEDUSA / "config.json").read_text())["num_heads"]
    assert by_name["medusa"].speculative_config() == {
        "method": "medusa",
        "num_speculative_tokens": medusa_heads,
        "model": str(REFERENCE_MEDUSA.resolve()),
    }
    assert by_name["ablation"].kind == "clover"
    assert by_name["clover"].speculative_config()["draft_budget"] == "goodput"  # the default


def test_each_draft_budget_is_a_method_of_its_own():
    methods = resolve_methods(
        ["clover"], str(REFERENCE_HEADS), "", 4, [f"abl={REFERENCE_HEADS}"], ("goodput", "fixed")
    )
    assert [m.name for m in methods] == ["vanilla", "clover", "clover-fixed", "abl", "abl-fixed"]
    budgets = [m.speculative_config()["draft_budget"] for m in methods[1:]]
    assert budgets == ["goodput", "fixed", "goodput", "fixed"]
    with pytest.raises(BenchError, match="--dtype must be one of float32, bfloat16"):
        BenchConfig(methods=methods, dtype="float16")
    with pytest.raises(BenchError, match="--draft-budgets"):
        resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], ("table",))


def test_floor_budget_drafts_nothing_at_any_batch_size():
    """The floor is vLLM's own batch-size table at K = 0: the engine speculates, drafts nothing."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    methods = resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], ("goodput", "floor"))
    assert [m.name for m in methods] == ["vanilla", "clover", "clover-floor"]
    spec = methods[2].speculative_config()
    assert spec["draft_budget"] == "fixed" and spec["num_speculative_tokens"] == 4
    schedule = [list(entry) for entry in spec["num_speculative_tokens_per_batch_size"]]
    for max_num_seqs in (1, 4, 64, 1024):
        lookup = build_dynamic_sd_schedule_lookup(schedule, max_num_seqs, 4)
        assert lookup[1:] == [0] * max_num_seqs
    json.dumps(spec)  # recorded in results.json


def test_greedy_drafts_are_a_method_of_their_own():
    """Drawn drafts are Clover's default (nothing passed); greedy ones are asked for."""
    sampling = ("probabilistic", "greedy")
    methods = resolve_methods(
        ["clover"], str(REFERENCE_HEADS), "", 4, [], ("goodput", "fixed"), (), (0.0,), sampling
    )
    names = ["vanilla", "clover", "clover-greedy", "clover-fixed", "clover-fixed-greedy"]
    assert [m.name for m in methods] == names
    configs = [m.speculative_config() for m in methods[1:]]
    assert [c.get("draft_sample_method") for c in configs] == [None, "greedy"] * 2
    with pytest.raises(BenchError, match="--draft-sampling"):
        resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], ("goodput",), (), (0,), ())


def test_each_tree_is_a_method_next_to_the_chain():
    tree = "[(0,), (1,), (0, 0)]"
    methods = resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], trees=(tree,))
    assert [m.name for m in methods] == ["vanilla", "clover", "clover-tree3"]
    spec = methods[-1].speculative_config()
    assert spec["speculative_token_tree"] == tree and spec["num_speculative_tokens"] == 3
    pruned = resolve_methods(
        [], str(REFERENCE_HEADS), "", 4, [], trees=(tree,), tree_confidences=(0.0, 0.05, "goodput")
    )
    names = ["vanilla", "clover-tree3", "clover-tree3-c0.05", "clover-tree3-goodput"]
    assert [m.name for m in pruned] == names
    assert pruned[2].speculative_config()["draft_confidence"] == 0.05
    assert "draft_confidence" not in pruned[1].speculative_config()
    assert pruned[3].speculative_config()["draft_budget"] == "goodput"
    with pytest.raises(BenchError, match=r"--tree-confidence \[1.5\]"):
        resolve_methods([], str(REFERENCE_HEADS), "", 4, [], trees=(tree,), tree_confidences=(1.5,))
    with pytest.raises(BenchError, match=r"--tree: path \(1, 0\) has no parent"):
        resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], trees=("[(0,), (1, 0)]",))
    with pytest.raises(BenchError, match="--tree: path .* is 5 deep"):
        resolve_methods(
            [], str(REFERENCE_HEADS), "", 4, [], trees=(str([(0,) * d for d in range(1, 6)]),)
        )


def test_a_variant_runs_the_heads_with_more_speculative_config_keys():
    """--clover-variant NAME={json}: an engine A/B on the --clover-heads checkpoint."""
    variant = 'k2={"draft_budget": "fixed", "num_speculative_tokens": 2, "draft_confidence": [0.3]}'
    methods = resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], variants=(variant,))
    k2 = methods[-1]
    assert (k2.name, k2.num_speculative_tokens) == ("k2", 2)
    assert k2.speculative_config() == {
        "method": "clover",
        "num_speculative_tokens": 2,
        "model": str(REFERENCE_HEADS.resolve()),
        "draft_budget": "fixed",
        "draft_confidence": (0.3,),
    }
    for bad, message in (
        ("k2=nope", "not JSON"),
        ("k2=[1]", "expects NAME="),
        ('clover={"draft_budget": "fixed"}', "two methods are named clover"),
    ):
        with pytest.raises(BenchError, match=message):
            resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], variants=(bad,))


def test_bad_methods_and_checkpoints(tmp_path):
    with pytest.raises(BenchError, match="unknown method.*'eagle'"):
        resolve_methods(["eagle"], "", "", 4, [])
    with pytest.raises(BenchError, match="clover: checkpoint folder not found: /nope"):
        checkpoint_heads("/nope", "clover", "clover")
    with pytest.raises(BenchError, match="missing config.json"):
        checkpoint_heads(tmp_path, "clover", "clover")
    with pytest.raises(BenchError, match="model_type must be 'medusa', got 'clover'"):
        checkpoint_heads(REFERENCE_HEADS, "medusa", "medusa")
    with pytest.raises(BenchError, match="NAME=DIR"):
        parse_named_dir("just-a-dir")
    assert parse_named_dir("no-ad = /x/y") == ("no-ad", "/x/y")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_sizes": (1, 0)}, "batch sizes"),
        ({"temperatures": (-1.0,)}, "temperatures"),
        ({"max_tokens": 0}, "--max-tokens"),
        ({"methods": (CLOVER,)}, "first method must be vanilla"),
        ({"methods": (VANILLA, CLOVER, CLOVER)}, "unique"),
        ({"repeats": 0}, "--repeats must be >= 1"),
        ({"engines": ("threads",)}, "--engines must be distinct values among"),
        ({"engines": ()}, "--engines must be"),
        ({"ignore_eos": "sometimes"}, "--ignore-eos must be one of auto, always, never"),
    ],
)
def test_config_validation_errors(changes, message):
    with pytest.raises(BenchError, match=message):
        BenchConfig(**{"methods": (VANILLA, CLOVER), **changes})


def test_quick_preset_and_explicit_flags():
    parser = build_parser()
    from vllm_clover.bench.arguments import config_from_args

    quick = config_from_args(parser.parse_args(["bench", "--quick", "--out", "/tmp/x"]))
    assert quick.batch_sizes == QUICK_PRESET["batch_sizes"] and quick.temperatures == (0.0,)
    assert (quick.repeats, quick.engines) == (1, ("in-process",))
    full = config_from_args(parser.parse_args(["bench"]))
    assert (full.repeats, full.engines) == (3, ("in-process", "multiprocess"))
    compiled = config_from_args(parser.parse_args(["bench", "--compiled"]))
    assert compiled.compiled and not full.compiled  # eager unless asked
    chosen = config_from_args(
        parser.parse_args(["bench", "--repeats", "5", "--engines", "multiprocess"])
    )
    assert (chosen.repeats, chosen.engines) == (5, ("multiprocess",))
    assert {m.kind for m in quick.methods} == {"vanilla", "ngram", "medusa", "clover"}
    custom = config_from_args(
        parser.parse_args(
            ["bench", "--quick", "--batch-sizes", "2", "8", "--max-tokens", "7", "--no-plots"]
        )
    )
    assert (custom.batch_sizes, custom.max_tokens, custom.plots) == ((2, 8), 7, False)
    assert (
        full.tie_check
        and not config_from_args(parser.parse_args(["bench", "--no-tie-check"])).tie_check
    )
    assert [custom.num_prompts(b) for b in (1, 4, 16)] == [8, 8, 32]  # max(min, 2 x batch)


def test_answers_run_past_eos_where_their_lengths_are_random():
    """auto: T > 0 runs go to max_tokens (random lengths would time different work), T = 0
    runs stop at EOS as vanilla's do; the flag reaches each engine job and results.md."""
    assert [ignores_eos("auto", t) for t in (0.0, 0.7, 1.0)] == [False, True, True]
    assert [ignores_eos("always", t) for t in (0.0, 1.0)] == [True, True]
    assert [ignores_eos("never", t) for t in (0.0, 1.0)] == [False, False]
    from vllm_clover.bench.arguments import config_from_args
    from vllm_clover.bench.runner import engine_jobs

    parser = build_parser()
    assert config_from_args(parser.parse_args(["bench"])).ignore_eos == "auto"
    chosen = config_from_args(parser.parse_args(["bench", "--ignore-eos", "never"]))
    jobs = engine_jobs(chosen, "target", [[{"role": "user", "content": "hi"}]])
    assert {job.ignore_eos for job in jobs} == {"never"}
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--ignore-eos", "sometimes"])


def test_cli_reports_bad_input_before_any_engine(tmp_path, capsys):
    assert main(["bench", "--methods", "vanilla", "magic"]) == 2
    assert "vllm-clover bench: error: unknown method(s) 'magic'" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["bench", "--prompts", str(empty), "--out", str(tmp_path / "out")]) == 2
    assert "empty file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
