"""generate-data with its default engine, vLLM: the command end to end on the reference target."""

import json

import pytest

from helpers import run_python
from vllm_clover.assets.data import mtbench_questions
from vllm_clover.training.config import GenerateConfig
from vllm_clover.training.data import load_conversations
from vllm_clover.training.generate_data import hf_generator

pytestmark = pytest.mark.engine

MAX_NEW_TOKENS = 16
MAX_MODEL_LEN = 256


def test_vllm_engine_answers_as_transformers_and_drops_what_does_not_fit(
    reference_target, mtbench_path, tmp_path
):
    """Greedy, float32: the replies written equal the hf engine's (transformers), in the
    prompts' order; a prompt that leaves no room for the reply is dropped and named."""
    questions = [q.turns[0] for q in mtbench_questions(mtbench_path)[:4]]
    too_long = "word " * MAX_MODEL_LEN
    prompts = tmp_path / "prompts.jsonl"
    records = [{"prompt": q} for q in (*questions[:2], too_long, *questions[2:])]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "answers.jsonl"
    args = ["generate-data", "--target", str(reference_target), "--data", str(prompts)]
    args += ["--out", str(out), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    args += ["--max-model-len", str(MAX_MODEL_LEN)]  # the default engine: vLLM
    code = f"from vllm_clover.cli import main; import sys; sys.exit(main({args!r}))"
    output = run_python(f"if __name__ == '__main__':\n    {code}")
    assert "wrote 4 conversation(s) (1 dropped)" in output, output[-2000:]
    assert "1 with a first prompt too long for the context" in output, output[-2000:]

    answers = load_conversations(out)
    assert [[m.role for m in c.messages] for c in answers] == [["user", "assistant"]] * 4
    assert [c.messages[0].content for c in answers] == questions
    cfg = GenerateConfig(
        data=str(prompts),
        out=str(tmp_path / "unused.jsonl"),
        target=str(reference_target),
        engine="hf",
        max_new_tokens=MAX_NEW_TOKENS,
        max_model_len=MAX_MODEL_LEN,
        device="cpu",
        dtype="float32",
    )
    chats = [[{"role": "user", "content": q}] for q in questions]
    transformers_replies = hf_generator(str(reference_target), cfg)(chats)
    assert [c.messages[1].content for c in answers] == transformers_replies
