"""House rules of the suite and the tree: every test says the behaviour it holds."""

from __future__ import annotations

import ast
import re
import subprocess
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


REPO = TESTS.parent
PACKAGES = (
    "agents", "endpoint", "eventlog", "events", "gateway", "gatewayapi", "ops", "projections",
    "reducers", "tests",
)  # fmt: skip


def _too_long(root: Path) -> list[str]:
    """Modules over their size (issue 9): 300 lines in ``ops/cli``, 500 elsewhere."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            cap = 300 if path.parent.name == "cli" and path.parent.parent.name == "ops" else 500
            lines = len(path.read_text().splitlines())
            if lines > cap:
                out.append(f"{path.relative_to(root)}: {lines} > {cap}")
    return out


def test_modules_stay_small() -> None:
    """No command module over 300 lines, no other module over 500 (someone new reads
    a module whole)."""
    assert _too_long(REPO) == []


def test_the_size_rule_finds_a_long_module(tmp_path: Path) -> None:
    """The size rule is not vacuous: a 301-line command module is found."""
    (tmp_path / "ops" / "cli").mkdir(parents=True)
    (tmp_path / "ops" / "cli" / "big.py").write_text("x = 1\n" * 301)
    assert _too_long(tmp_path) == ["ops/cli/big.py: 301 > 300"]


# The team's documents live beside the repository, not in it: a clone of ppf alone has
# none of them, so nothing in it may cite one (tests read data fixtures there, and skip
# when they are absent: data, not a reference).
_OUTSIDE = re.compile(r"ARCHITECTURE\.md|FIELD-NOTES|STYLE\.md|\.\./shared/(?!fixtures)")
_DOC = re.compile(r"docs/([a-z-]+)\.md(?:,? ?(§\d+)(?:\s*(?:,|and)\s*(§\d+))*)?")
# A module or document of the repository cited by its path (the changelog is history: it names what
# was, so it is not held to what is).
_FOLDERS = "agents|deploy|docs|endpoint|events|gateway|ops|projections|reducers|schemas|tests"
_PATH = re.compile(rf"(?<![\w/.])((?:{_FOLDERS})/[\w./-]*?\.(?:py|md|c))\b")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    keep = (".py", ".md", ".json", ".conf", ".toml", ".sql", ".yml", ".yaml", "Makefile")
    this = "tests/test_conventions.py"  # names what it forbids
    return [
        REPO / p
        for p in out
        if p.endswith(keep) and not p.startswith("tests/fixtures") and p != this
    ]


def _broken_references(files: list[Path]) -> list[str]:
    """Each cited file or document of ours that does not exist, a section of the
    contract it has not, and every citation of a document outside the repository."""
    sections = {
        m.group(1)
        for m in re.finditer(r"^## (\d+)\. ", (REPO / "docs/architecture.md").read_text(), re.M)
    }
    broken = []
    for path in files:
        text = path.read_text(errors="replace")
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
        broken += [f"{name}: {m.group(0)}" for m in _OUTSIDE.finditer(text)]
        if str(name) != "CHANGELOG.md":
            cited = {m.group(1) for m in _PATH.finditer(text)} - {
                m.group(0) for m in _DOC.finditer(text)
            }
            broken += [f"{name}: {c}" for c in sorted(cited) if not (REPO / c).exists()]
        for m in _DOC.finditer(text):
            if not (REPO / "docs" / f"{m.group(1)}.md").exists():
                broken.append(f"{name}: {m.group(0)}")
            elif m.group(1) == "architecture":
                cited = re.findall(r"§(\d+)", m.group(0))
                broken += [f"{name}: §{n}" for n in cited if n not in sections]
    return broken


def test_every_reference_resolves_inside_the_repository() -> None:
    """No file cites a document outside the repository; every ``docs/*.md`` cited exists,
    and every section of the contract cited (``docs/architecture.md §N``) is one it has."""
    assert _broken_references(_tracked()) == []


def test_the_reference_rule_finds_what_does_not_resolve(tmp_path: Path) -> None:
    """The rule is not vacuous: a team document, a missing file, a missing doc and a
    missing section are each found; a fixture path, a file and a section that exist
    are not."""
    bad = tmp_path / "x.py"
    bad.write_text(
        '"""See ARCHITECTURE.md, docs/nowhere.md and docs/architecture.md §12; the rows\n'
        "of docs/architecture.md §4 hold (reducers/fold.py, not reducers/gone.py); data in\n"
        '../shared/fixtures/sources."""\n'
    )
    found = _broken_references([bad])
    want = ["x.py: ARCHITECTURE.md", "x.py: reducers/gone.py", "x.py: docs/nowhere.md", "x.py: §12"]
    assert found == want, found


# The product's modules, and the imports between them: every ``import`` and ``from``,
# under ``TYPE_CHECKING`` and inside functions too. ``from package import name`` is an
# import of the module ``package.name`` when there is one, else of the package.
PRODUCT = (
    "agents", "endpoint", "eventlog", "events", "gateway", "gatewayapi", "ops", "projections",
    "reducers",
)  # fmt: skip


def _imports(root: Path) -> dict[str, set[str]]:
    modules = {}
    for package in PRODUCT:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in modules]
                targets += [node.module] if len(targets) < len(subs) else []
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_needs_one_that_needs_it() -> None:
    """No import circle among the product's modules: a shared name lives in the module
    that owns it, below the ones that use it."""
    assert _circles(_imports(REPO)) == []


def test_the_circle_rule_finds_a_circle(tmp_path: Path) -> None:
    """The rule is not vacuous: a circle through a function-level import and a
    ``TYPE_CHECKING`` one is found; ``from package import module`` is no circle."""
    pkg = tmp_path / "reducers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from reducers.a import A\n")
    (pkg / "a.py").write_text("from reducers import b\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from reducers.c import C\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import reducers.b\n"
    )
    assert _circles(_imports(tmp_path)) == [["reducers.b", "reducers.c"]]


# On Python 3.11 ``asyncio.wait_for`` loses a cancellation that comes in the same turn as
# its result (projections/tasks.py): a loop that waits with it can take its stop's
# ``cancel()`` and go on, and the stop then waits for it for ever (a gateway's pool view
# held a test's teardown until its timeout). ``asyncio.timeout`` counts cancellations.
def _waits_for(root: Path) -> list[str]:
    out = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "wait_for"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "asyncio"
                ):
                    out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_the_product_bounds_its_waits_with_asyncio_timeout() -> None:
    """No ``asyncio.wait_for`` in the product: its waits are ``asyncio.timeout``, which
    a stop's cancellation cannot slip past on Python 3.11."""
    assert _waits_for(REPO) == []


def test_the_wait_rule_finds_a_wait_for(tmp_path: Path) -> None:
    """The rule is not vacuous: an ``asyncio.wait_for`` in a loop of the gateway's is
    found, a fold's ``wait_for`` method is not."""
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "loop.py").write_text(
        "import asyncio\n\nasync def f(fold, e):\n    await fold.wait_for(3, 1)\n"
        "    await asyncio.wait_for(e.wait(), 1)\n"
    )
    assert _waits_for(tmp_path) == ["gateway/loop.py:5"]
