"""The examples stay well-formed and documented (they are run by hand: each starts vLLM).

Python examples must compile, carry a docstring (their usage) and keep engine work under a
`__main__` guard (vLLM starts workers with spawn, which re-imports the script); shell
examples must pass `bash -n`; every file in examples/ must be listed in examples/README.md.
"""

import ast
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.unit

EXAMPLES = REPO / "examples"
INDEX = EXAMPLES / "README.md"


def example_files(suffix: str = "") -> list[Path]:
    return sorted(
        p for p in EXAMPLES.rglob(f"*{suffix}") if p.is_file() and "__pycache__" not in p.parts
    )


def test_there_are_examples():
    names = {p.name for p in example_files()}
    assert {"offline_generation.py", "train_your_own_heads.sh", "self_check.py"} <= names


@pytest.mark.parametrize("path", example_files(".py"), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_python_example_compiles_with_docstring_and_main_guard(path):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    compile(tree, str(path), "exec")
    assert ast.get_docstring(tree), f"{path.name}: no module docstring (usage)"
    assert 'if __name__ == "__main__":' in source, f"{path.name}: no __main__ guard"


@pytest.mark.parametrize("path", example_files(".sh"), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_shell_example_parses(path):
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_example_is_listed_in_the_index():
    index = INDEX.read_text()
    unlisted = [
        str(p.relative_to(EXAMPLES))
        for p in example_files()
        if p != INDEX and f"`{p.relative_to(EXAMPLES)}`" not in index
    ]
    assert not unlisted, f"not in examples/README.md: {unlisted}"
