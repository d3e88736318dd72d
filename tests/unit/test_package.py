"""The package's shape: every folder a regular package whose docstring names what it holds,
each one placed in docs/design.md, and the root importable without vLLM or torch."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vllm_clover"


def code_folders() -> list[Path]:
    return sorted(
        p
        for p in PACKAGE.rglob("*")
        if p.is_dir() and any(p.glob("*.py")) and p.name != "__pycache__"
    )


def test_every_folder_is_a_package_with_a_docstring():
    folders = code_folders()
    assert {p.name for p in folders} >= {"core", "budget", "tree", "hybrid", "patches", "modeling"}
    for folder in folders:
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 8, f"{init.relative_to(ROOT)}: no docstring"


def test_design_doc_places_every_folder():
    design = (ROOT / "docs" / "design.md").read_text()
    for folder in code_folders():
        name = folder.relative_to(PACKAGE).as_posix()
        assert f"`{name}/`" in design, f"docs/design.md does not name `{name}/`"


def test_importing_the_package_pulls_in_neither_vllm_nor_torch():
    code = (
        "import sys, vllm_clover; "
        "sys.exit(any(m.split('.')[0] in ('vllm', 'torch') for m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
