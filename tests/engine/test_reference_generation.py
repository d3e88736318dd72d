"""The real vLLM engine generates correctly from the offline reference target."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import in_process_llm, run_python
from vllm_clover.assets.data import mtbench_questions
from vllm_clover.demo import SANITY_ANSWER, SANITY_QUESTION

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def llm(reference_target):
    """One in-process engine for the module (2-3 s start instead of ~20 s)."""
    with in_process_llm(reference_target, max_num_seqs=16) as engine:
        yield engine


def _greedy(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def test_greedy_chat_answers_paris(llm):
    output = llm.chat([{"role": "user", "content": SANITY_QUESTION}], _greedy(32))[0]
    assert SANITY_ANSWER in output.outputs[0].text
    assert output.outputs[0].finish_reason == "stop"  # ends with <|im_end|>


def test_batched_greedy_equals_one_at_a_time(llm, mtbench_path):
    """Batch invariance of the target alone: the baseline Clover's equivalence tests rely on."""
    chats = [[{"role": "user", "content": q.turns[0]}] for q in mtbench_questions(mtbench_path)[:8]]
    batched = [o.outputs[0].token_ids for o in llm.chat(chats, _greedy(48), use_tqdm=False)]
    alone = [llm.chat(c, _greedy(48), use_tqdm=False)[0].outputs[0].token_ids for c in chats]
    assert [len(t) for t in batched] == [48] * 8
    assert batched == alone


def test_demo_command_compares_clover_with_vanilla(reference_target):
    """The README's main job, small, with its default heads (the bundled Clover-2 ones) and
    Clover's default settings: both runs, identical greedy outputs in float32, the figures,
    and nothing else on the terminal: vLLM's own output (its log lines, its progress bars,
    PyTorch's C++ warnings) goes to the log file the last line names."""
    code = (
        "from vllm_clover.cli import main; import sys; sys.exit(main(['demo', "
        "'--num-prompts', '2', '--max-tokens', '32', '--dtype', 'float32']))"
    )
    output = run_python(f"if __name__ == '__main__':\n    {code}")
    lines = output.strip().splitlines()
    assert lines[0].startswith("Clover demo: SmolLM2-135M-Instruct (float32) on "), output
    assert "contains 'Paris' (both engines)" in output
    assert "outputs: 2/2 token-identical to vanilla" in output
    assert "x vanilla" in output
    tau = re.search(r"tau ([0-9.]+) tokens per verification step", output)
    assert tau and float(tau.group(1)) > 1, output[-3000:]  # Clover drafted, drafts accepted
    assert len(lines) <= 8 and all(not line.startswith("(") for line in lines), output
    assert " INFO " not in output and "WARNING" not in output and "Loading" not in output
    log = re.fullmatch(r"vLLM's own output: (.+) \(--verbose shows it here\)", lines[-1])
    assert log, lines[-1]
    assert "Initializing a V1 LLM engine" in Path(log.group(1)).read_text()


def test_demo_refuses_a_heads_folder_that_is_no_checkpoint(tmp_path):
    code = (
        "from vllm_clover.cli import main; import sys; "
        f"sys.exit(main(['demo', '--heads', {str(tmp_path)!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert f"vllm-clover demo: error: --heads {tmp_path}: missing config.json" in result.stderr
