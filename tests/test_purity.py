"""The core stays pure, and the arrows between the rooms point one way.

The core (``events/`` but its one edge module ``mint.py``, ``reducers/``, and the read
models in ``projections/``) imports nothing beyond the stdlib, msgspec and the core, and
not every stdlib module is harmless: no clock, no randomness, no I/O. Outside the core,
``gateway/`` and ``projections/`` import nothing from ``ops/``, and ``agents/`` import
only the log client from it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# events/mint.py is the edges' clock and entropy: the core must not import it (below).
EDGE_IN_EVENTS = ROOT / "events" / "mint.py"
READ_MODELS = ["readmodels.py", "snapshot.py", "chunks.py", "digest.py", "recheck.py"]
CORE = (
    sorted((ROOT / "reducers").rglob("*.py"))
    + [p for p in sorted((ROOT / "events").glob("*.py")) if p != EDGE_IN_EVENTS]
    + [ROOT / "projections" / name for name in READ_MODELS]
)
FORBIDDEN = {
    "asyncio",
    "time",
    "datetime",
    "random",
    "secrets",
    "uuid",
    "os",
    "io",
    "pathlib",
    "subprocess",
    "threading",
    "multiprocessing",
    "selectors",
    "select",
    "ssl",
    "http",
    "urllib.request",
    "sqlite3",
    "logging",
    "structlog",
    "nats",
    "aiohttp",
    "aiohttp_socks",
    "duckdb",
    "axiom_py",
    "projections",
    "agents",
    "gateway",
    "ops",
}
# socket only for its pure address parser; nothing that opens a socket.
ALLOWED_FROM = {"socket": {"AF_INET", "inet_pton"}}


def _imports(path: Path) -> list[tuple[str, set[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, set()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, {alias.name for alias in node.names}))
    return found


@pytest.mark.parametrize("path", CORE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_core_module_imports_only_pure_things(path: Path) -> None:
    """A core module imports only the stdlib's pure parts, msgspec and the core."""
    allowed_roots = {"msgspec", "events", "reducers", "__future__", "typing"}
    read_models = {f"projections.{n.removesuffix('.py')}" for n in READ_MODELS}
    for module, names in _imports(path):
        assert module != "events.mint", f"{path.name} imports the clock module"
        if module in read_models:
            continue
        root = module.split(".")[0]
        if root in ALLOWED_FROM:
            assert names and names <= ALLOWED_FROM[root], f"{path.name}: {module} {names}"
            continue
        assert module not in FORBIDDEN and root not in FORBIDDEN, f"{path.name} imports {module}"
        assert root in allowed_roots or root in sys.stdlib_module_names, (
            f"{path.name} imports {module}, outside the stdlib, msgspec and events/"
        )


def _not_python(folder: Path) -> list[str]:
    """Files of a core folder that are not Python source (build caches aside): the fold's
    rules are written once, in Python, never twinned in C, C++ or Cython."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".py", ".so"}
    )


def test_reducers_hold_python_only() -> None:
    """Every file under reducers/ is Python: the rules live in one language."""
    assert _not_python(ROOT / "reducers") == []


def test_the_python_only_rule_finds_a_c_twin(tmp_path: Path) -> None:
    """The rule is not vacuous: a C file, or one in a subfolder, is found."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "fold.py").write_text("")
    (tmp_path / "_fast.c").write_text("")
    (tmp_path / "parts" / "x.pyx").write_text("")
    assert _not_python(tmp_path) == ["_fast.c", "parts/x.pyx"]


def test_the_check_itself_catches_a_clock(tmp_path: Path) -> None:
    """The rule above is not vacuous: a reducer reading the clock is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom reducers import fold\n")
    roots = [m.split(".")[0] for m, _ in _imports(bad)]
    assert "time" in roots and "time" in FORBIDDEN


OUTSIDE_OPS = ["gateway", "projections", "reducers", "events"]
LOG_CLIENT = "ops.nats.client"


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize(
    "path",
    [p for f in OUTSIDE_OPS for p in _modules(f)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_inner_rooms_import_nothing_from_ops(path: Path) -> None:
    """gateway/, projections/, reducers/ and events/ never import ops/ (even lazily)."""
    for module, _ in _imports(path):
        assert module.split(".")[0] != "ops", f"{path.relative_to(ROOT)} imports {module}"


@pytest.mark.parametrize("path", _modules("agents"), ids=lambda p: p.name)
def test_agents_import_only_the_log_client_from_ops(path: Path) -> None:
    """agents/ reach ops/ only through the JetStream client."""
    for module, _ in _imports(path):
        if module.split(".")[0] == "ops":
            assert module == LOG_CLIENT, f"agents/{path.name} imports {module}"


def test_the_direction_check_catches_a_back_arrow(tmp_path: Path) -> None:
    """The direction rule is not vacuous: a gateway module importing ops is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ops.nats.server import NatsServer\n")
    assert [m for m, _ in _imports(bad)] == ["ops.nats.server"]
