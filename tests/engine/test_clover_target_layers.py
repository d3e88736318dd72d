"""Heads that read the target's middle layers (``target_layers``) under vLLM: the rows the
proposer receives are [H | L_2 | L_15 | L_27] exactly as the trainer's teacher computes them
(Hugging Face ``hidden_states``), and greedy output equals vanilla with a chain and a tree,
with drafts accepted. The heads are the shipped Clover-2 ones, trained to read layers 2, 15
and 27, so every draft depends on the layers."""

from pathlib import Path

import pytest
import torch
from spec_checks import (
    TEST_TREE,
    TEST_TREE_SIZE,
    assert_clover_speculated,
    assert_trees_verified,
    speculation,
    tree_stats,
)

from helpers import in_process_llm, mtbench_prompts
from vllm_clover.bundled import CLOVER2_HEADS

pytestmark = pytest.mark.engine

LAYERS = [2, 15, 27]  # vLLM's EAGLE-3 default for a 30-layer target
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def layered_heads() -> Path:
    """-clover2, whose config reads LAYERS and whose trained fusion weights are not zero."""
    from vllm_clover.modeling import read_clover

    config, state = read_clover(CLOVER2_HEADS)
    assert config.target_layers == LAYERS
    projs = [t for n, t in state.items() if n.startswith("layer_fusion.projs.")]
    assert len(projs) == len(LAYERS) and all(w.abs().max() > 0 for w in projs)
    return CLOVER2_HEADS


@pytest.fixture(scope="module")
def cases(reference_target, mtbench_path):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(reference_target)
    prompts = mtbench_prompts(tokenizer, mtbench_path, 6)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    with in_process_llm(reference_target, max_num_seqs=4) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return prompts, params, [list(o.outputs[0].token_ids) for o in outputs]


def _record_signal(worker) -> None:
    """Keep the first rows the proposer fuses (the prompt's prefill) on the drafter."""
    drafter = worker.model_runner.drafter
    fuse = drafter.model.fuse

    def recording(signal):
        if not hasattr(drafter, "first_signal"):
            drafter.first_signal = signal.detach().clone()
        return fuse(signal)

    drafter.model.fuse = recording


def test_proposer_reads_the_layers_the_trainer_reads(reference_target, layered_heads, cases):
    """Prefill of one prompt: the rows handed to the heads equal the teacher's signal,
    H = hidden_states[-1] and L_j = hidden_states[j] (the input of decoder layer j)."""
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    prompts = cases[0]
    spec = {"method": "clover", "model": str(layered_heads)}
    with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=1) as llm:
        llm.collective_rpc(_record_signal)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
        (signal,) = llm.collective_rpc(lambda worker: worker.model_runner.drafter.first_signal)
    ids = torch.tensor([prompts[0]["prompt_token_ids"]])
    model = AutoModelForCausalLM.from_pretrained(reference_target, dtype=torch.float32)
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    expected = torch.cat([states[-1][0], *(states[j][0] for j in LAYERS)], dim=-1)
    assert signal.shape == expected.shape == (ids.shape[1], 4 * 576)
    for a in range(4):  # H, then each layer, against its own scale
        got, want = signal[:, a * 576 : (a + 1) * 576], expected[:, a * 576 : (a + 1) * 576]
        assert (got - want).abs().max() <= 1e-3 * want.abs().max(), f"slot {a}"


@pytest.mark.parametrize(("max_num_seqs", "tree"), [(1, None), (4, None), (4, TEST_TREE)])
def test_greedy_output_equals_vanilla(reference_target, layered_heads, cases, max_num_seqs, tree):
    prompts, params, expected = cases
    spec = {"method": "clover", "model": str(layered_heads)}
    if tree:
        spec["speculative_token_tree"] = tree
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=max_num_seqs
    ) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = speculation(llm)
        (width,) = llm.collective_rpc(lambda w: w.model_runner.drafter.draft_log.signal_width)
        trees = tree_stats(llm) if tree else None
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    assert width == 4 * 576  # [H | L_2 | L_15 | L_27] reached the heads
    assert_clover_speculated(stats)
    if tree:
        assert_trees_verified(trees, TEST_TREE_SIZE, stats)
