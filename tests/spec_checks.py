"""What speculative decoding did in an engine or a server, and the checks built on it.

Equal outputs prove vLLM's rejection sampler, not Clover: a test that claims Clover also
shows with these that Clover drafted, that its drafts were accepted, and (trees) that the
tree was verified. Engines and servers come from helpers.py.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from helpers import run_python

SPEC_PREFIX = "vllm:spec_decode_"


@dataclass(frozen=True)
class Speculation:
    """What speculative decoding did in one engine: vLLM's counters and the proposer's log.

    Equal outputs prove vLLM's rejection sampler, not Clover; a test that claims Clover also
    shows with this that Clover drafted and that its drafts were accepted.
    """

    drafter: str  # the class the model runner drafted with ("" if unknown, e.g. a server)
    drafts: int  # verification steps that carried drafts (one per request per step)
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]
    steps_by_k: dict[int, int]  # CloverProposer.propose calls per draft length K
    max_requests: int = 0  # the most requests CloverProposer drafted for in one step
    max_step_tokens: int = 0  # the most tokens one step's target forward scheduled
    drafts_by_length: dict[int, int] = field(default_factory=dict)  # requests per draft length

    @property
    def tau(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    def __sub__(self, before: Speculation) -> Speculation:
        """What happened between the snapshot `before` and this one (same engine)."""
        size = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        after_pos, before_pos = (
            tuple(p) + (0,) * (size - len(p))
            for p in (self.accepted_per_pos, before.accepted_per_pos)
        )
        steps = {k: n - before.steps_by_k.get(k, 0) for k, n in self.steps_by_k.items()}
        return Speculation(
            self.drafter,
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(after_pos, before_pos, strict=True)),
            {k: n for k, n in steps.items() if n},
            self.max_requests,
            self.max_step_tokens,
            {
                n: c - before.drafts_by_length.get(n, 0)
                for n, c in self.drafts_by_length.items()
                if c - before.drafts_by_length.get(n, 0)
            },
        )


def _drafter_report(worker) -> tuple:
    drafter = worker.model_runner.drafter
    log = getattr(drafter, "draft_log", None)
    if log is None:
        return type(drafter).__name__, (), 0, 0, ()
    steps = tuple(sorted(log.steps_by_k.items()))
    lengths = tuple(sorted(log.drafts_by_length.items()))
    return type(drafter).__name__, steps, log.max_requests, log.max_step_tokens, lengths


def speculation(llm) -> Speculation:
    """The engine's cumulative speculation so far (an `in_process_llm`, stats on)."""
    ((drafter, steps_by_k, max_requests, max_step_tokens, lengths),) = set(
        llm.collective_rpc(_drafter_report)
    )
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    per_pos: tuple[int, ...] = ()
    for metric in llm.get_metrics():
        name = metric.name.removeprefix(SPEC_PREFIX)
        if name in totals:
            totals[name] += int(metric.value)
        elif name == "num_accepted_tokens_per_pos":
            per_pos = tuple(int(v) for v in metric.values)
    return Speculation(
        drafter,
        totals["num_drafts"],
        totals["num_draft_tokens"],
        totals["num_accepted_tokens"],
        per_pos,
        dict(steps_by_k),
        max_requests,
        max_step_tokens,
        dict(lengths),
    )


def _drawn(worker) -> int:
    return worker.model_runner.drafter.draft_log.drawn


def drawn_drafts(llm) -> int:
    """Requests whose drafts the proposer drew at random (draft_sample_method
    "probabilistic") in an `in_process_llm`, summed over drafting calls."""
    return sum(llm.collective_rpc(_drawn))


def goodput_budget(llm):
    """The scheduler's GoodputController of an `in_process_llm` (None where K is fixed)."""
    from vllm_clover.patches.channel import SchedulerChannel, channel_of

    channel = channel_of(llm.llm_engine.engine_core.engine_core.scheduler, SchedulerChannel)
    return None if channel is None else channel.budget


def cut_short(llm) -> int:
    """Chains the proposer of an `in_process_llm` drafted that the confidence stop ended
    short of their step's K, after 0 to K - 1 drafts."""
    (chains,) = llm.collective_rpc(_cut_short)
    return chains


def _cut_short(worker) -> int:
    return worker.model_runner.drafter.draft_log.cut_short


def _target_compilation(worker) -> tuple[str, str, bool]:
    config = worker.vllm_config.compilation_config
    (model,) = [m for m in worker.model_runner.model.modules() if hasattr(m, "do_not_compile")]
    return config.mode.name, config.backend, not model.do_not_compile and model.compiled


def target_compilation(llm) -> tuple[str, str, bool]:
    """(vLLM's compilation mode, its backend, whether the target's model was compiled)."""
    (compilation,) = llm.collective_rpc(_target_compilation)
    return compilation


def tree_paths(tree: str) -> list[tuple[int, ...]]:
    """A token tree as written for vLLM ("[(0,), (1,), (0, 0)]"), read without the plugin's
    parser: one path of top-k ranks per node."""
    return ast.literal_eval(tree)


# The token tree the engine tests verify: 8 nodes, three ranks at depth 1, four deep.
TEST_TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)]"

TEST_TREE_SIZE = len(tree_paths(TEST_TREE))


@dataclass(frozen=True)
class TreeStats:
    """What a tree engine's verifier counted (``TreeVerifier``)."""

    verified: int  # requests whose tree was verified
    off_chain: int  # ... whose accepted path used a node of rank > 0 (no chain accepts it)
    accepted_by_depth: tuple[int, ...]  # accepted paths reaching each depth
    drafted_by_node: tuple[int, ...] = ()  # times each node was verified


def _tree_report(worker) -> tuple:
    from vllm_clover.patches.channel import RunnerChannel, channel_of

    channel = channel_of(worker.model_runner, RunnerChannel)
    trees = None if channel is None else channel.trees
    if trees is None:
        return 0, 0, (), ()
    by_depth, by_node = tuple(trees.accepted_by_depth), tuple(trees.drafted_by_node)
    return trees.verified, trees.off_chain, by_depth, by_node


def tree_stats(llm) -> TreeStats:
    """The tree verifier's counters of an `in_process_llm` with speculative_token_tree."""
    (report,) = set(llm.collective_rpc(_tree_report))
    return TreeStats(*report)


def assert_trees_verified(stats: TreeStats, tree_size: int, spec: Speculation) -> None:
    """Trees were drafted (requests got more drafts than the tree is deep), verified, and
    paths that leave the rank-0 chain were accepted: what only a tree accepts."""
    assert stats.verified > 0, f"no tree was verified: {stats}"
    assert stats.off_chain > 0, f"no accepted path left the rank-0 chain: {stats}"
    assert spec.drafts_by_length.get(tree_size, 0) > 0, f"no full tree drafted: {spec}"
    assert_clover_speculated(spec)


def server_speculation(metrics_text: str, server_log: str) -> Speculation:
    """The same from a server's /metrics text and its log (the drafter is named in the log)."""

    def total(name: str) -> int:
        pattern = rf"^{re.escape(SPEC_PREFIX + name)}_total(?:{{[^}}]*}})? ([0-9.e+]+)$"
        return int(sum(float(v) for v in re.findall(pattern, metrics_text, re.MULTILINE)))

    per_pos = re.findall(
        rf'^{SPEC_PREFIX}num_accepted_tokens_per_pos_total{{[^}}]*position="(\d+)"[^}}]*}} '
        r"([0-9.e+]+)$",
        metrics_text,
        re.MULTILINE,
    )
    by_position = sorted((int(p), int(float(v))) for p, v in per_pos)
    drafter = "CloverProposer" if "drafting with CloverProposer" in server_log else ""
    return Speculation(
        drafter,
        total("num_drafts"),
        total("num_draft_tokens"),
        total("num_accepted_tokens"),
        tuple(v for _, v in by_position),
        {},
    )


def assert_clover_speculated(spec: Speculation, k: int | None = None, fixed: bool = False) -> None:
    """Clover was the drafter, it drafted, and the target accepted some of its drafts.

    With k: no request was ever given more than k drafts, and the shipped heads' confidence
    stop (their draft_confidence) cut some chains short of k. With fixed: every verification
    step carried exactly k drafts per request (heads without thresholds, or turned off).
    """
    assert spec.drafter == "CloverProposer", f"drafted with {spec.drafter!r}, not Clover"
    assert spec.drafts > 0, f"Clover never drafted: {spec}"
    assert spec.accepted > 0, f"no Clover draft was accepted: {spec}"
    if k is None:
        return
    if fixed:
        assert spec.draft_tokens == k * spec.drafts, f"not {k} drafts per step: {spec}"
        return
    assert spec.draft_tokens < k * spec.drafts, f"no chain was cut short of {k}: {spec}"
    assert max(spec.drafts_by_length, default=0) <= k, f"more than {k} drafts: {spec}"


@dataclass(frozen=True)
class CloverRun:
    """One Clover engine of ``greedy_with_and_without_clover``: its greedy tokens and what it
    speculated, or the error with which the engine refused to start (``refused``)."""

    tokens: list[list[int]] | None = None
    speculation: Speculation | None = None
    refused: str | None = None


# Run in a child by greedy_with_and_without_clover, after TESTS (this folder) and ARGS (JSON).
GREEDY_SCRIPT = """
import json, sys
from contextlib import ExitStack
from dataclasses import asdict
sys.path.insert(0, TESTS)
from vllm import SamplingParams
from helpers import in_process_llm
from spec_checks import speculation


def tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def main(target, specs, prompts, max_tokens, engine_args):
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    with in_process_llm(target, **engine_args) as llm:
        runs = {"vanilla": {"tokens": tokens(llm.generate(prompts, greedy, use_tqdm=False))}}
    for name, spec in specs.items():
        with ExitStack() as stack:
            try:
                llm = stack.enter_context(
                    in_process_llm(target, speculative_config=spec, **engine_args)
                )
            except Exception as err:  # a start-up refusal, which the test expects or fails on
                runs[name] = {"refused": f"{type(err).__name__}: {err}"}
                break
            got = tokens(llm.generate(prompts, greedy, use_tqdm=False))
            runs[name] = {"tokens": got, "speculation": asdict(speculation(llm))}
    print("RESULT " + json.dumps(runs))


if __name__ == "__main__":  # no engine proxy may outlive main(): vLLM walks module globals
    main(**json.loads(ARGS))
"""


def greedy_with_and_without_clover(
    target: Path, specs: dict[str, dict], prompts: list[dict], max_tokens: int, **engine_args
) -> tuple[list[list[int]], dict[str, CloverRun]]:
    """(vanilla tokens, a CloverRun per named speculative config) for greedy `prompts`, all
    computed in one child interpreter (one vLLM import for all the engines): vLLM serves some
    architectures (e.g. OLMo-2) through its Transformers backend, which patches that Hugging
    Face model class in the process it runs in, and later code in the test process must still
    find the class as it was. An engine that refuses its config at start-up is reported, with
    the error, as ``CloverRun.refused``; no engine starts after it (put such configs last)."""
    import json

    args = dict(target=str(target), specs=specs, prompts=prompts, max_tokens=max_tokens)
    args["engine_args"] = engine_args
    header = f"TESTS = {str(Path(__file__).parent)!r}\nARGS = {json.dumps(args)!r}\n"
    output = run_python(header + GREEDY_SCRIPT)
    (line,) = [line for line in output.splitlines() if line.startswith("RESULT ")]
    runs = json.loads(line[len("RESULT ") :])
    vanilla = runs.pop("vanilla")["tokens"]
    return vanilla, {name: _clover_run(run) for name, run in runs.items()}


def _clover_run(run: dict) -> CloverRun:
    stats = run.get("speculation")
    if stats is not None:
        stats["accepted_per_pos"] = tuple(stats["accepted_per_pos"])
        stats["steps_by_k"] = {int(k): n for k, n in stats["steps_by_k"].items()}
        stats["drafts_by_length"] = {int(k): n for k, n in stats["drafts_by_length"].items()}
        stats = Speculation(**stats)
    return CloverRun(run.get("tokens"), stats, run.get("refused"))
