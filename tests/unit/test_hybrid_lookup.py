"""The prompt lookup (hybrid/lookup.py): vLLM's ngram rule, without numba."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import run_python
from vllm_clover.hybrid.lookup import prompt_lookup

pytestmark = pytest.mark.unit


def test_the_docstring_example():
    """The example of docs/design/drafting.md, "The lookup rule"."""
    history = np.array([5, 9, 2, 7, 5, 9, 2])
    continuation, n = prompt_lookup(history, 2, 3, 4, 1000)
    assert n == 3 and continuation.tolist() == [7, 5, 9, 2]
    assert prompt_lookup(history, 2, 3, 2, 1000)[0].tolist() == [7, 5]  # k
    assert prompt_lookup(history, 2, 3, 4, 9)[0].tolist() == [7, 5]  # max_model_len - 7
    assert prompt_lookup(np.array([1, 2, 3, 4]), 2, 3, 4, 1000)[1] == 0  # no repeat
    assert prompt_lookup(history, 4, 5, 4, 1000)[1] == 0  # shorter than min_n


def _cases(count: int, seed: int) -> list[tuple[list[int], int, int, int, int]]:
    """Random low-alphabet histories (many matches), with min_n, max_n, k, max_model_len."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        history = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 60))).tolist()
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 3))
        cases.append((history, min_n, max_n, int(rng.integers(1, 6)), len(history) + 3))
    return cases


def test_equal_to_vllms_own_ngram_kernel(tmp_path):
    """vLLM's numba kernel runs in a child process (numba must not enter this one: it
    breaks later engine starts), on the same random cases."""
    cases = _cases(1500, seed=0)
    path, out = tmp_path / "cases.json", tmp_path / "expected.json"
    path.write_text(json.dumps(cases))
    code = "\n".join(
        [
            "import json, numpy as np",
            "from vllm.v1.spec_decode.ngram_proposer import (",
            "    _find_longest_matched_ngram_and_propose_tokens as find)",
            f"cases = json.load(open({str(path)!r}))",
            f"open({str(out)!r}, 'w').write(json.dumps(",
            "    [find(np.array(h, dtype=np.int32), a, b, m, k).tolist()",
            "     for h, a, b, k, m in cases]))",
        ]
    )
    run_python(code)
    expected = json.loads(out.read_text())
    ours = [prompt_lookup(np.array(h), a, b, k, m)[0].tolist() for h, a, b, k, m in cases]
    assert ours == expected


def test_importing_the_hybrid_leaves_numba_out():
    code = (
        "import sys\nimport vllm_clover.hybrid.drafter\nimport vllm_clover.core.proposer\n"
        "print('numba loaded:', 'numba' in sys.modules)"
    )
    assert "numba loaded: False" in run_python(code)  # stderr follows stdout there
