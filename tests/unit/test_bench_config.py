"""`vllm-clover bench`: methods, Clover variants, options and bad input."""

from __future__ import annotations

import json
from pathlib import Path

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
from vllm_clover.tree import TokenTree

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)


def _variant(text):
    """The one method --clover-variant `text` adds to vanilla (on the reference heads)."""
    return resolve_methods([], str(REFERENCE_HEADS), "", 4, [], (text,))[-1]


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
    with pytest.raises(BenchError, match="--dtype must be one of float32, bfloat16"):
        BenchConfig(methods=methods, dtype="float16")


def test_a_variant_runs_the_heads_with_more_speculative_config_keys():
    """--clover-variant NAME={json}: an engine A/B on the --clover-heads checkpoint."""
    variant = 'k2={"draft_budget": "fixed", "num_speculative_tokens": 2, "draft_confidence": [0.3]}'
    methods = resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], (variant,))
    assert methods[1].speculative_config() == {  # Clover's defaults: nothing more passed
        "method": "clover",
        "num_speculative_tokens": 4,
        "model": str(REFERENCE_HEADS.resolve()),
    }
    k2 = methods[-1]
    assert (k2.name, k2.num_speculative_tokens) == ("k2", 2)
    assert k2.speculative_config() == {
        "method": "clover",
        "num_speculative_tokens": 2,
        "model": str(REFERENCE_HEADS.resolve()),
        "draft_budget": "fixed",
        "draft_confidence": (0.3,),
    }
    greedy = _variant(f'greedy={{"draft_sample_method": "greedy", "model": "{REFERENCE_HEADS}"}}')
    assert greedy.speculative_config()["draft_sample_method"] == "greedy"
    assert greedy.model == str(REFERENCE_HEADS.resolve())


def test_the_floor_variant_drafts_nothing_at_any_batch_size():
    """vLLM's own batch-size table at K = 0: the engine speculates, drafts nothing."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    table = '"num_speculative_tokens_per_batch_size": [[1, 1048576, 0]]'
    spec = _variant(f'floor={{"draft_budget": "fixed", {table}}}').speculative_config()
    assert spec["draft_budget"] == "fixed" and spec["num_speculative_tokens"] == 4
    schedule = [list(entry) for entry in spec["num_speculative_tokens_per_batch_size"]]
    for max_num_seqs in (1, 4, 64, 1024):
        lookup = build_dynamic_sd_schedule_lookup(schedule, max_num_seqs, 4)
        assert lookup[1:] == [0] * max_num_seqs
    json.dumps(spec)  # recorded in results.json


def test_a_tree_variant_drafts_its_nodes():
    """K is the tree's node count; "default" is the checkpoint's own tree."""
    tree = "[(0,), (1,), (0, 0)]"
    spec = _variant(f't={{"speculative_token_tree": "{tree}"}}')
    assert spec.speculative_config() == {
        "method": "clover",
        "num_speculative_tokens": 3,
        "model": str(REFERENCE_HEADS.resolve()),
        "speculative_token_tree": tree,
    }
    own = json.loads((REFERENCE_HEADS / "config.json").read_text())["token_tree"]
    default = _variant('tree={"speculative_token_tree": "default"}')
    assert default.speculative_config()["speculative_token_tree"] == str(TokenTree.parse(own))
    assert default.num_speculative_tokens == TokenTree.parse(own).num_nodes


@pytest.mark.parametrize(
    "variant, message",
    [
        ("k2=nope", "--clover-variant k2: not JSON"),
        ("k2=[1]", "expects NAME="),
        ('={"draft_budget": "fixed"}', "expects NAME="),
        ("k2", "expects NAME="),
        ('clover={"draft_budget": "fixed"}', "two methods are named clover"),
        (
            'x={"draft_budgets": "fixed"}',
            "--clover-variant x: unknown speculative_config key.*'draft_budgets' .*draft_budget?",
        ),
        ('x={"method": "eagle"}', '"method" is clover'),
        (
            'x={"draft_budget": "floor"}',
            '--clover-variant x: draft_budget "floor": Input should be',
        ),
        ('x={"num_speculative_tokens": "two"}', 'num_speculative_tokens "two"'),
        ('x={"num_speculative_tokens": 5}', "num_speculative_tokens=5: .* has 4 heads"),
        ('x={"model": "/nope"}', "--clover-variant x: checkpoint folder not found: /nope"),
        (
            'x={"speculative_token_tree": "[(0,), (1, 0)]"}',
            r"x: speculative_token_tree: path \(1, 0\) has no parent",
        ),
        ('x={"speculative_token_tree": "%s"}' % [(0,) * d for d in range(1, 6)], "is 5 deep"),
        ('x={"speculative_token_tree": "[(0,)]", "num_speculative_tokens": 2}', "has 1 nodes"),
    ],
)
def test_bad_variants_name_the_problem(variant, message):
    with pytest.raises(BenchError, match=message):  # as config_from_args meets them
        BenchConfig(
            methods=resolve_methods(["clover"], str(REFERENCE_HEADS), "", 4, [], (variant,))
        )


def test_a_default_tree_needs_one_in_the_checkpoint(tmp_path):
    config = json.loads((REFERENCE_HEADS / "config.json").read_text())
    del config["token_tree"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BenchError, match='"default": .* records no token_tree'):
        _variant(f'x={{"speculative_token_tree": "default", "model": "{tmp_path}"}}')


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
        ({"methods": (VANILLA, CLOVER, CLOVER)}, "two methods are named clover: name them"),
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
        parser.parse_args(["bench", "--quick", "--batch-sizes", "2", "8", "--max-tokens", "7"])
    )
    assert (custom.batch_sizes, custom.max_tokens) == ((2, 8), 7)
    fixed = ["--clover-variant", 'fixed={"draft_budget": "fixed"}']
    variant = config_from_args(parser.parse_args(["bench", "--methods", "vanilla", *fixed]))
    assert [(m.name, dict(m.options)) for m in variant.methods[1:]] == [
        ("fixed", {"draft_budget": "fixed"})
    ]
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
    assert main(["bench", "--clover-variant", 'x={"draft_budget": 1']) == 2
    assert "vllm-clover bench: error: --clover-variant x: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_eagle3_method_reads_its_k_from_the_drafter_folder(tmp_path: Path) -> None:
    """eagle3 runs vLLM's own method on a train-eagle3 folder, K from its config; a missing
    flag or a folder of another kind is refused naming it."""
    from test_eagle3_network import drafter

    from vllm_clover.eagle3.checkpoint import save_eagle3

    folder = save_eagle3(drafter(steps=2), tmp_path / "e3", "t")
    methods = resolve_methods(["eagle3"], "", "", 4, [], (), str(folder))
    assert methods[-1].speculative_config() == {
        "method": "eagle3",
        "num_speculative_tokens": 2,
        "model": str(folder.resolve()),
    }
    with pytest.raises(BenchError, match="--eagle3-drafter DIR"):
        resolve_methods(["eagle3"], "", "", 4, [])
    with pytest.raises(BenchError, match="not an EAGLE-3 drafter"):
        resolve_methods(["eagle3"], "", "", 4, [], (), str(REFERENCE_HEADS))
