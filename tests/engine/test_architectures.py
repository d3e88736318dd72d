"""Clover heads for targets other than Llama, tried as a new user would, end to end.

For five tiny random-weight Hugging Face targets built here (Mistral, Qwen2 with q/k/v
biases, Phi-3 with fused projections, Gemma 3 with offset norms, q/k norms, GELU and scaled
embeddings, OLMo-2 with norms after the sublayers): `generate-data --engine hf` self-distils
the target's own answers, `train` trains heads on them, vLLM loads the checkpoint, and the
greedy output with Clover equals vanilla decoding with drafts accepted. The Augmenting Block
is trained where it can mirror the target's last layer (checked numerically by `train`) and
refused, naming what differs, where it cannot.
"""

from __future__ import annotations

import pytest
from spec_checks import assert_clover_speculated, greedy_with_and_without_clover

from tiny_targets import (
    build_tiny_target,
    synthetic_conversations,
    torch_threads,
    write_jsonl,
)
from vllm_clover.cli import main
from vllm_clover.modeling.checkpoint import read_config_json
from vllm_clover.training import TrainConfig, TrainingError, train

pytestmark = pytest.mark.engine

# architecture -> does the Augmenting Block mirror its last layer?
ARCHITECTURES = {"gemma3": False, "mistral": True, "olmo2": False, "phi3": True, "qwen2": True}
# vLLM model classes without the target's middle layers (no SupportsEagle3): heads with
# target_layers are refused at start-up there.
NO_TARGET_LAYERS = {"gemma3"}
MAX_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def workspace(request, tmp_path_factory) -> dict:
    """A tiny target of one architecture and its self-distilled data."""
    architecture = request.param
    root = tmp_path_factory.mktemp(architecture)
    conversations = synthetic_conversations(40, seed=1)
    target = build_tiny_target(
        root / "target", conversations, hidden_size=128, architecture=architecture
    )
    prompts = write_jsonl(root / "prompts.jsonl", conversations)
    distilled = root / "distilled.jsonl"
    with torch_threads(1):
        code = main(
            [
                "generate-data",
                "--target",
                str(target),
                "--data",
                str(prompts),
                "--out",
                str(distilled),
                "--engine",
                "hf",
                "--max-new-tokens",
                "48",
                "--max-model-len",
                "256",
            ]
        )
    assert code == 0
    return {"architecture": architecture, "root": root, "target": target, "data": distilled}


def _train(workspace: dict, augmenting_block: bool, out: str, **overrides):
    cfg = TrainConfig(
        target=str(workspace["target"]),
        data=str(workspace["data"]),
        out=str(workspace["root"] / out),
        num_heads=3,
        augmenting_block=augmenting_block,
        epochs=6,
        batch_size=4,
        lr=3e-3,
        max_seq_len=128,
        eval_fraction=0.1,
        cache_dir=str(workspace["root"] / "cache"),
        progress=False,
        **overrides,
    )
    with torch_threads(1):
        return train(cfg)


@pytest.fixture(scope="module")
def heads(workspace):
    return _train(workspace, ARCHITECTURES[workspace["architecture"]], "heads").out


def test_the_augmenting_block_is_trained_or_refused_naming_why(workspace, heads):
    config = read_config_json(heads)
    mirrored = ARCHITECTURES[workspace["architecture"]]
    assert config["use_augmenting_block"] is mirrored
    if not mirrored:
        with pytest.raises(TrainingError) as err:
            _train(workspace, True, "refused")
        message = str(err.value)
        assert "cannot start as a copy of its last layer" in message
        assert "--no-augmenting-block" in message and "its last layer has parameters" in message


def _prompts(workspace: dict) -> list[dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(workspace["target"])
    questions = [c.messages[0].content for c in synthetic_conversations(8, seed=99)]
    prompts = []
    for question in questions:
        chat = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(getattr(ids, "input_ids", ids))})
    return prompts


@pytest.fixture(scope="module")
def served(workspace, heads) -> tuple[list[list[int]], dict]:
    """Greedy output without Clover, with the heads and with heads trained with
    --target-layers (those last: an engine may refuse them), from one child interpreter."""
    block = ARCHITECTURES[workspace["architecture"]]
    layered = _train(workspace, block, "layers", target_layers=[1]).out
    fixed_k3 = {"method": "clover", "num_speculative_tokens": 3, "draft_budget": "fixed"}
    specs = {
        "heads": {**fixed_k3, "model": str(heads)},
        "layers": {**fixed_k3, "model": str(layered)},
    }
    run = dict(max_num_seqs=8, max_model_len=256)
    prompts = _prompts(workspace)
    return greedy_with_and_without_clover(workspace["target"], specs, prompts, MAX_TOKENS, **run)


def test_greedy_output_equals_vanilla_with_drafts_accepted(served):
    expected, runs = served
    assert runs["heads"].refused is None, runs["heads"].refused
    assert runs["heads"].tokens == expected
    assert_clover_speculated(runs["heads"].speculation, k=3, fixed=True)  # no thresholds


def test_heads_reading_target_layers_serve_or_are_refused_naming_why(workspace, served):
    """Heads trained with --target-layers: where vLLM's model class returns the target's
    middle layers, greedy output equals vanilla with drafts accepted; elsewhere the engine
    refuses them at start-up, naming the class."""
    expected, runs = served
    run = runs["layers"]
    if workspace["architecture"] in NO_TARGET_LAYERS:
        assert run.refused is not None and "does not implement SupportsEagle3" in run.refused
        assert "reads the target's layers [1]" in run.refused
        return
    assert run.refused is None, run.refused
    assert run.tokens == expected
    assert_clover_speculated(run.speculation, k=3, fixed=True)
