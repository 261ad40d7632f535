"""House rules of the suite itself (STYLE.md): every test says the behaviour it holds."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _tests_without_a_docstring(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}::{node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test")
        and not ast.get_docstring(node)
    ]


def test_every_test_has_a_docstring() -> None:
    """Every test function carries a docstring naming the behaviour it holds."""
    missing = [
        name for path in sorted(TESTS.glob("*.py")) for name in _tests_without_a_docstring(path)
    ]
    assert missing == []


def test_the_docstring_rule_finds_a_bare_test(tmp_path: Path) -> None:
    """The rule is not vacuous: a test without a docstring is found."""
    bare = tmp_path / "test_bare.py"
    bare.write_text("def test_x():\n    assert True\n")
    assert _tests_without_a_docstring(bare) == ["test_bare.py::test_x"]
