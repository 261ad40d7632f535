"""The core stays pure: reducers import nothing beyond the stdlib, msgspec and events/.

And not every stdlib module is harmless: no clock, no randomness, no I/O.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = sorted((ROOT / "reducers").glob("*.py")) + sorted((ROOT / "events").glob("*.py"))
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
    allowed_roots = {"msgspec", "events", "__future__", "typing"}
    if path.parent.name == "reducers":
        allowed_roots.add("reducers")
    for module, names in _imports(path):
        root = module.split(".")[0]
        if root in ALLOWED_FROM:
            assert names and names <= ALLOWED_FROM[root], f"{path.name}: {module} {names}"
            continue
        assert module not in FORBIDDEN and root not in FORBIDDEN, f"{path.name} imports {module}"
        assert root in allowed_roots or root in sys.stdlib_module_names, (
            f"{path.name} imports {module}, outside the stdlib, msgspec and events/"
        )


def test_the_check_itself_catches_a_clock(tmp_path: Path) -> None:
    """The rule above is not vacuous: a reducer reading the clock is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom reducers import fold\n")
    roots = [m.split(".")[0] for m, _ in _imports(bad)]
    assert "time" in roots and "time" in FORBIDDEN
