"""The suite keeps its tests: every test the suite ever listed is in it still, or names
its successor. A test deleted or overwritten without one (as seven attacker tests once
were, when a file was given to other tests) fails here.

``tests/names.txt`` lists the suite's tests (``file.py::name``, ``file.py::Class::name``),
and, after a line ``# gone``, each test that went with its successor
(``gone -> successor``). Adding tests: ``python -m tests.test_names`` appends their
names; a name that goes is moved under ``# gone`` by hand, with what holds its rule now.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NAMES = TESTS / "names.txt"
_GONE = "# gone"


def suite(root: Path) -> list[str]:
    """The test functions of ``root``'s ``test_*.py`` files, classes' included."""
    out = []
    for path in sorted(root.glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if _is_test(node):
                out.append(f"{path.name}::{node.name}")  # type: ignore[attr-defined]
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                out += [f"{path.name}::{node.name}::{m.name}" for m in node.body if _is_test(m)]
    return out


def _is_test(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def read(text: str) -> tuple[list[str], dict[str, str]]:
    """(the names listed, {gone: successor})."""
    listed: list[str] = []
    gone: dict[str, str] = {}
    past = False
    for line in text.splitlines():
        line = line.strip()
        if line == _GONE:
            past = True
        elif line and not line.startswith("#"):
            if past:
                old, _, new = line.partition(" -> ")
                gone[old.strip()] = new.strip()
            else:
                listed.append(line)
    return listed, gone


def problems(names: list[str], text: str) -> list[str]:
    """What the suite and its list disagree on."""
    listed, gone = read(text)
    here = set(names)
    out = []
    for name in listed:
        if name not in here:
            out.append(f"{name}: gone from the suite; list it under '{_GONE}' with its successor")
    for old, new in gone.items():
        if not new:
            out.append(f"{old}: gone without a successor")
        elif new not in here:
            out.append(f"{old}: its successor {new} is not in the suite")
    known = set(listed)
    out += [f"{n}: not listed (python -m tests.test_names)" for n in names if n not in known]
    return out


def test_the_suite_keeps_every_test_it_listed() -> None:
    """Every listed test is in the suite, every test that went names a successor that
    is, and every test of the suite is listed."""
    assert problems(suite(TESTS), NAMES.read_text()) == []


def test_the_names_rule_finds_a_test_gone_without_successor(tmp_path: Path) -> None:
    """The rule is not vacuous: a listed test deleted is found; listed under ``# gone``
    with a successor in the suite it passes; with a successor that is not, it is found."""
    (tmp_path / "test_a.py").write_text(
        "def test_kept():\n    pass\n\nclass TestC:\n    def test_m(self):\n        pass\n"
    )
    names = suite(tmp_path)
    assert names == ["test_a.py::test_kept", "test_a.py::TestC::test_m"]
    listed = "test_a.py::test_kept\ntest_a.py::TestC::test_m\n"
    assert problems(names, listed) == []
    assert problems(names, listed + "test_a.py::test_gone\n") == [
        "test_a.py::test_gone: gone from the suite; list it under '# gone' with its successor"
    ]
    moved = listed + "# gone\ntest_a.py::test_gone -> test_a.py::test_kept\n"
    assert problems(names, moved) == []
    lost = listed + "# gone\ntest_a.py::test_gone -> test_b.py::test_x\n"
    assert problems(names, lost) == [
        "test_a.py::test_gone: its successor test_b.py::test_x is not in the suite"
    ]
    assert problems([*names, "test_a.py::test_new"], listed) == [
        "test_a.py::test_new: not listed (python -m tests.test_names)"
    ]


def _append_new() -> int:
    text = NAMES.read_text() if NAMES.exists() else ""
    listed, _ = read(text)
    new = [n for n in suite(TESTS) if n not in set(listed)]
    head, sep, tail = text.partition(_GONE)
    head = head.rstrip("\n") + "\n" if head.strip() else ""
    NAMES.write_text(head + "".join(f"{n}\n" for n in new) + (f"\n{sep}{tail}" if sep else ""))
    print(f"{len(new)} names added to {NAMES.name}")
    return 0


if __name__ == "__main__":
    sys.exit(_append_new())
