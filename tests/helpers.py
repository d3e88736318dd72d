"""Helpers shared by the tests: tiny random networks, engines, servers, child interpreters.

Fixtures live in conftest.py; everything a test calls directly lives here.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from vllm_clover.modeling import CloverConfig, CloverModel

REPO = Path(__file__).resolve().parents[1]
SERVER_STARTUP_TIMEOUT_S = 240

# ---------------------------------------------------------------- tiny random networks
D, V, K = 32, 120, 3  # hidden, vocab, heads of the tiny networks


def tiny_config(**overrides) -> CloverConfig:
    """A tiny Clover config (D = 32, V = 120, K = 3, 4 attention heads, 2 KV heads)."""
    fields = dict(
        hidden_size=D,
        vocab_size=V,
        num_heads=K,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        decoder_num_heads=4,
        rope_theta=1e3,
    )
    return CloverConfig(**{**fields, **overrides})


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Give every float parameter random values (so no component is at its identity init);
    1-D parameters (norm weights, biases) around 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen) + (1.0 if p.dim() == 1 else 0.0))


def random_clover(
    cfg: CloverConfig, seed: int = 0, scale: float = 0.2
) -> tuple[CloverModel, torch.Tensor]:
    """A CloverModel with random weights, a random draft vocabulary (if configured) and its
    random target LM head (V, D), attached."""
    torch.manual_seed(seed)
    model = CloverModel(cfg)
    randomize(model, seed + 1, scale)
    gen = torch.Generator().manual_seed(seed + 2)
    if cfg.draft_vocab_size:
        ids = torch.randperm(cfg.vocab_size, generator=gen)[: cfg.draft_vocab_size]
        model.tables.set_draft_vocab(ids.sort().values)
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    model.attach_target(lm_head)
    return model, lm_head


def chi_square_fit(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 10.0):
    """One-sample chi-square goodness of fit of integer samples (n,) to probs (V,):
    (statistic, dof, p-value). Categories expected fewer than min_expected times are pooled.
    Example: samples [0, 0, 1, 1], probs [0.5, 0.5] -> statistic 0, p-value 1."""
    n = samples.numel()
    observed = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * n
    rare = expected < min_expected
    observed = torch.cat([observed[~rare], observed[rare].sum().view(1)])
    expected = torch.cat([expected[~rare], expected[rare].sum().view(1)])
    keep = expected > 0
    statistic = float(((observed - expected)[keep] ** 2 / expected[keep]).sum())
    if bool((observed[~keep] > 0).any()):
        return float("inf"), int(keep.sum()) - 1, 0.0  # a sample where probs say never
    dof = int(keep.sum()) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))
    return statistic, dof, p_value


def hf_replies(target: Path, data: Path, batching: str, max_new_tokens: int = 10) -> list:
    """generate-data's transformers engine (``--hf-batching batching``, batches of 4, CPU) on
    the first user turn of every conversation in ``data``: one reply per chat."""
    from vllm_clover.training.config import GenerateConfig
    from vllm_clover.training.data import load_conversations
    from vllm_clover.training.generate_data import hf_generator

    chats = [[{"role": "user", "content": c.messages[0].content}] for c in load_conversations(data)]
    cfg = GenerateConfig(
        data=str(data),
        out=str(data.with_suffix(".unused.jsonl")),
        target=str(target),
        engine="hf",
        max_new_tokens=max_new_tokens,
        batch_size=4,
        device="cpu",
        hf_batching=batching,
    )
    return hf_generator(str(target), cfg)(chats)


# ---------------------------------------------------------------- engines and servers
def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run `code` in a fresh interpreter (vLLM spawns processes; each test gets clean state).

    Returns stdout+stderr; fails the test with that output on a non-zero exit.
    """
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"child exited {result.returncode}:\n{output[-6000:]}")
    return output


def make_untrained_clover(
    target_dir: Path, out_dir: Path, num_heads: int = 4, draft_vocab_size: int | None = None
) -> Path:
    """Clover heads for the reference target with random (seeded) head weights.

    The Augmenting Block starts as a copy of the target's last layer, the head blocks and
    W_V get small random weights so drafts vary. Acceptance is near zero: these heads test
    plumbing and output equivalence, not speed.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from vllm_clover.modeling import CloverConfig, CloverModel, save_clover, select_last_layers

    state = load_file(str(target_dir / "model.safetensors"))
    config = CloverConfig.from_target_config(
        AutoConfig.from_pretrained(target_dir),
        target_name="smollm2-135m-instruct",
        num_heads=num_heads,
        draft_vocab_size=draft_vocab_size,
    )
    torch.manual_seed(0)
    model = CloverModel(config)
    layers = {
        k[len("model.") :]: v.float() for k, v in state.items() if k.startswith("model.layers.")
    }
    model.augmenting.init_from_target(
        select_last_layers(layers, 1), state["model.norm.weight"].float()
    )
    with torch.no_grad():
        for block in model.heads.blocks:
            block.layers[0].weight.normal_(0, 0.02)
        model.heads.decoder.v_proj.weight.normal_(0, 0.02)
    model.attach_target(state["model.embed_tokens.weight"].float())
    if draft_vocab_size:
        model.tables.set_draft_vocab(torch.arange(draft_vocab_size) * (49152 // draft_vocab_size))
    return save_clover(model, config, out_dir, model_card="untrained test heads")


@contextlib.contextmanager
def in_process_llm(model: Path, **engine_args):
    """A vLLM engine in this process (start ~3-10 s instead of ~20 s), torn down after.

    Multiprocessing is off, so the worker is this process: collective_rpc functions run here.
    Yields a weak proxy of the LLM: the engine is torn down when the block ends.
    Stats are on (vLLM's speculative-decoding counters), unless disable_log_stats is passed.
    """
    import gc

    saved = {
        k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")
    }
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
    from vllm_clover.engine import start_llm

    engine_args.setdefault("disable_log_stats", False)  # the counters `speculation` reads
    llm = None
    try:
        llm = start_llm(str(model), **engine_args)
        # A proxy: the caller's `as` name must not keep the engine alive past the block, or
        # its teardown would run later, while the next engine uses vLLM's global state.
        yield weakref.proxy(llm)
    finally:
        del llm
        gc.collect()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> str:
    """GET `url`, return the body as text (raises OSError on HTTP or connection errors)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


@contextlib.contextmanager
def running_server(log_path: Path, extra_args=(), max_model_len: int = 1024):
    """`vllm-clover serve smollm2-135m-instruct ...` (float32, eager) on a free port of 127.0.0.1.

    Yields {"base": URL, "process": Popen, "log": log_path} once /health answers. The server
    runs in a process group of its own (API server, engine core, workers); on exit the whole
    group is killed, so no engine process outlives the test even if the API server is gone.
    """
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm_clover.cli",
        "serve",
        "smollm2-135m-instruct",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        *extra_args,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                http_get(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail(f"server did not come up:\n{log_path.read_text()[-5000:]}")
        yield {"base": base, "process": process, "log": log_path}
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group may have exited already
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


# ---------------------------------------------------------------- what speculation did
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
    return llm.llm_engine.engine_core.engine_core.scheduler.clover_budget


def mtbench_prompts(tokenizer, mtbench_path, n: int, system: str | None = None) -> list[dict]:
    """Chat-templated token ids of the first n MT-Bench first turns, as `LLM.generate`
    prompts, each after a system prompt when one is given."""
    from vllm_clover.assets.data import mtbench_questions

    prompts = []
    for question in mtbench_questions(mtbench_path)[:n]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": question.turns[0]}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(getattr(ids, "input_ids", ids))})
    return prompts


def metric_total(llm, name: str) -> float:
    """The sum of an `in_process_llm`'s metric `name` (e.g. "vllm:num_preemptions")."""
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def run_with_aborts(llm, prompts, params, aborted: list[str], at_step: int):
    """Step the engine through prompts (request ids "0", "1", ...), aborting the requests
    `aborted` after step `at_step`: ({request index: tokens} of the finished, the aborted
    ids still running when the abort came)."""
    engine = llm.llm_engine
    for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, param)
    finished, running_when_aborted = {}, set()
    for step in range(10_000):
        for output in engine.step():
            if output.finished:
                finished[int(output.request_id)] = list(output.outputs[0].token_ids)
        if step == at_step:
            running_when_aborted = set(aborted) - {str(i) for i in finished}
            engine.abort_request(aborted)
        if not engine.has_unfinished_requests():
            break
    return finished, running_when_aborted


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
    gapped: int = 0  # requests whose drafted nodes were not a breadth-first prefix
    drafted_by_node: tuple[int, ...] = ()  # times each node was verified
    budget_steps: int = 0  # decoding steps the tree budget learned from (draft_budget goodput)
    threshold: float | None = None  # the tree budget's threshold at the end


def _tree_report(worker) -> tuple:
    trees = getattr(worker.model_runner, "clover_trees", None)
    if trees is None:
        return 0, 0, (), 0, (), 0, None
    by_depth, by_node = tuple(trees.accepted_by_depth), tuple(trees.drafted_by_node)
    budget = trees.budget
    learned = (0, None) if budget is None else (budget.steps, budget.threshold())
    return trees.verified, trees.off_chain, by_depth, trees.gapped, by_node, *learned


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


def assert_trees_pruned(stats: TreeStats, tree_size: int, spec: Speculation) -> None:
    """Trees were drafted under a confidence threshold and verified: requests drafted
    subsets of different sizes, some that are not breadth-first prefixes (a node kept while
    an earlier one was left out), and paths off the rank-0 chain were accepted."""
    assert stats.verified > 0 and stats.off_chain > 0, f"no tree path off the chain: {stats}"
    lengths = {n for n, count in spec.drafts_by_length.items() if count and n > 0}
    assert len(lengths) > 1 and min(lengths) < tree_size, f"no pruned tree: {spec}"
    assert stats.gapped > 0, f"every drafted subset was a prefix of the tree: {stats}"
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


def greedy_with_and_without_clover(
    target: Path, spec: dict, prompts: list[dict], max_tokens: int, **engine_args
) -> tuple[list[list[int]], list[list[int]], Speculation]:
    """(vanilla tokens, Clover tokens, Clover's speculation) for greedy `prompts`, computed
    in a child interpreter: vLLM serves some architectures (e.g. OLMo-2) through its
    Transformers backend, which patches that Hugging Face model class in the process it runs
    in, and later code in the test process must still find the class as it was."""
    import json

    code = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from dataclasses import asdict
from vllm import SamplingParams
from helpers import in_process_llm, speculation


def tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def main():  # no engine proxy may outlive its block as a module global: vLLM walks those
    prompts, greedy = {prompts!r}, SamplingParams(temperature=0.0, max_tokens={max_tokens})
    with in_process_llm({str(target)!r}, **{engine_args!r}) as llm:
        expected = tokens(llm.generate(prompts, greedy, use_tqdm=False))
    with in_process_llm({str(target)!r}, speculative_config={spec!r}, **{engine_args!r}) as llm:
        got = tokens(llm.generate(prompts, greedy, use_tqdm=False))
        stats = asdict(speculation(llm))
    print("RESULT " + json.dumps([expected, got, stats]))


if __name__ == "__main__":
    main()
"""
    output = run_python(code)
    (line,) = [line for line in output.splitlines() if line.startswith("RESULT ")]
    expected, got, stats = json.loads(line[len("RESULT ") :])
    stats["accepted_per_pos"] = tuple(stats["accepted_per_pos"])
    stats["steps_by_k"] = {int(k): n for k, n in stats["steps_by_k"].items()}
    return expected, got, Speculation(**stats)
