"""Helpers shared by the tests: tiny random networks, engines, servers, child interpreters.

Fixtures live in conftest.py; what speculation did in an engine or a server, and the checks
built on it, in spec_checks.py; everything else a test calls directly lives here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from pathlib import Path

import pytest
import torch

from vllm_clover.modeling import CloverConfig, CloverModel
from vllm_clover.modeling.checkpoint import read_config_json
from vllm_clover.training.runtime import return_freed_memory

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
def fixed_budget_spec(heads: Path) -> dict:
    """speculative_config drafting as many tokens as `heads` has heads at every step
    (draft_budget "fixed"), so that each feature under test meets drafts at every step."""
    k = read_config_json(heads)["num_heads"]
    return {
        "method": "clover",
        "model": str(heads),
        "num_speculative_tokens": k,
        "draft_budget": "fixed",
    }


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
    saved = {
        k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")
    }
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
    from vllm import envs

    from vllm_clover.engine import start_llm

    # Each engine freezes vLLM's environment for the process (enable_envs_cache); unfrozen,
    # this engine reads the variables as the test set them, not as the first engine did.
    envs.disable_envs_cache()
    engine_args.setdefault("disable_log_stats", False)  # the counters `speculation` reads
    llm = None
    try:
        llm = start_llm(str(model), **engine_args)
        # A proxy: the caller's `as` name must not keep the engine alive past the block, or
        # its teardown would run later, while the next engine uses vLLM's global state.
        yield weakref.proxy(llm)
    finally:
        # vLLM's shutdown unfreezes the heap frozen at start (start_llm, EngineCore); left to
        # the engine's finalizer it never runs, since the frozen engine is never collected,
        # and each engine a test worker starts keeps its ~2 GB while the next one runs.
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        return_freed_memory()
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
