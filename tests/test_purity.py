"""The core stays pure, and the arrows between the rooms point one way.

The core is three folders: ``events/`` (but its two edge modules: ``mint.py``, the
edges' clock and entropy, and ``pages.py``, the edges' page decoding), ``reducers/`` and
``projections/core/``. It imports nothing beyond
the stdlib, msgspec and the core, and not every stdlib module is harmless: no clock, no
randomness, no I/O. Outside the core, nothing but ``ops/`` imports ``ops/``: the log the
rooms need is ``eventlog/`` (the NATS adapter), below them, which imports none of them.
Inside the endpoint, its three rooms (connection, router, link) import only the rooms
below them.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# events/mint.py is the edges' clock and entropy, events/pages.py their page decoding:
# the core must not import either (below).
EDGE_IN_EVENTS = (ROOT / "events" / "mint.py", ROOT / "events" / "pages.py")
CORE_FOLDERS = (ROOT / "events", ROOT / "reducers", ROOT / "projections" / "core")
CORE = [p for f in CORE_FOLDERS for p in sorted(f.rglob("*.py")) if p not in EDGE_IN_EVENTS]
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
    for module, names in _imports(path):
        assert module not in ("events.mint", "events.pages"), f"{path.name} imports an edge's"
        if module == "projections.core" or module.startswith("projections.core."):
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


# The log below the gateway (the NATS adapter) and what it may not import: the rooms
# above it, and ops/.
LOG = "eventlog"
ABOVE_THE_LOG = ("ops", "projections", "gateway", "agents", "endpoint")


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imported(path: Path, roots: tuple[str, ...]) -> list[str]:
    """What of the packages ``roots`` a module imports, even lazily."""
    return [m for m, _ in _imports(path) if m.split(".")[0] in roots]


@pytest.mark.parametrize(
    "path",
    [
        p
        for f in ("agents", "endpoint", "gateway", "projections", "reducers", "events")
        for p in _modules(f)
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_rooms_import_nothing_of_ops(path: Path) -> None:
    """agents/, endpoint/, gateway/, projections/, reducers/ and events/ import nothing of
    ops/: the log they need is eventlog/, below them."""
    assert _imported(path, ("ops",)) == []


@pytest.mark.parametrize("path", _modules("gatewayapi"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_gateway_client_imports_none_of_the_rooms(path: Path) -> None:
    """gatewayapi/ (the gateway's API as ppf calls it) imports events/ and its own
    modules: the agents, the endpoint and ops/ use it, and it needs none of them."""
    assert _imported(path, (*ABOVE_THE_LOG, LOG, "reducers")) == []


@pytest.mark.parametrize("path", _modules(LOG), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_log_imports_nothing_above_it(path: Path) -> None:
    """eventlog/ imports events/ and its own modules, none of the rooms that use it."""
    assert _imported(path, ABOVE_THE_LOG) == []


def test_the_direction_check_catches_a_back_arrow(tmp_path: Path) -> None:
    """The direction rule is not vacuous: a lazy import of ops/ or of a room above the
    log is found, the log itself and events/ are not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from eventlog.dial import dial\nimport events\ndef f():\n    from ops.geo import x\n"
        "    from projections.store import Store\n"
    )
    assert _imported(bad, ("ops",)) == ["ops.geo"]
    assert _imported(bad, ABOVE_THE_LOG) == ["ops.geo", "projections.store"]


# The endpoint's rooms, top to bottom: each may import only the rooms below it. The
# feed and its helpers (endpoint/*.py) feed the router from the gateways: never a room's
# to import, and never importing the connection room.
ENDPOINT_ROOMS = ("connection", "router", "link")
# A Protocol of more methods restates a class rather than declaring a lower room's few
# callbacks. (A Protocol of fields only is a shape: ``Facts``, the fields the pool reads
# of a row, which events/wire.py's ProxyRoute, made at import, cannot say to mypy.)
PROTOCOL_METHODS = 6
ENDPOINT_CLASS_LINES = 250


def _room(module: str) -> str:
    """The endpoint room (or "edge" for endpoint/*.py) a module name belongs to; ""
    outside the endpoint."""
    parts = module.split(".")
    if parts[0] != "endpoint" or len(parts) < 2:
        return ""
    return parts[1] if parts[1] in ENDPOINT_ROOMS else "edge"


def _back_arrows(path: Path, own: str) -> list[str]:
    """What of the endpoint a module of room ``own`` imports that it may not."""
    allowed = {
        "connection": {"connection", "router", "link"},
        "router": {"router", "link"},
        "link": {"link"},
        "edge": {"edge", "router", "link"},
    }[own]
    return [m for m, _ in _imports(path) if _room(m) and _room(m) not in allowed]


@pytest.mark.parametrize("path", _modules("endpoint"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_endpoint_rooms_import_downwards_only(path: Path) -> None:
    """connection/ imports router/ and link/; router/ imports link/; link/ neither;
    the feed's modules no room above the router (endpoint/__init__.py)."""
    rel = path.relative_to(ROOT / "endpoint")
    own = rel.parts[0] if len(rel.parts) > 1 else "edge"
    assert _back_arrows(path, own) == []


def test_the_room_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The room rule is not vacuous: a link importing the router is found, its own
    room is not."""
    bad = tmp_path / "bad.py"
    bad.write_text("from endpoint.link.request import Request\nfrom endpoint.router import x\n")
    assert _back_arrows(bad, "link") == ["endpoint.router"]


def _classes(path: Path) -> list[ast.ClassDef]:
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def _lines(cls: ast.ClassDef) -> int:
    return (cls.end_lineno or cls.lineno) - cls.lineno + 1


def _protocol_methods(cls: ast.ClassDef) -> int | None:
    """How many methods a Protocol declares (None: not a Protocol)."""
    if not any(isinstance(b, ast.Name) and b.id == "Protocol" for b in cls.bases):
        return None
    return sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in cls.body)


def test_the_endpoint_has_no_long_class_and_no_protocol_restating_one() -> None:
    """No class of the endpoint over 250 lines; its Protocols are a lower room's few
    callbacks, never a class restated to cut an import circle."""
    long, restated = [], []
    for path in _modules("endpoint"):
        for cls in _classes(path):
            if (
                cls.end_lineno is not None
                and cls.end_lineno - cls.lineno + 1 > ENDPOINT_CLASS_LINES
            ):
                long.append(f"{path.name}:{cls.name}")
            methods = _protocol_methods(cls)
            if methods is not None and methods > PROTOCOL_METHODS:
                restated.append(f"{path.name}:{cls.name} ({methods})")
    assert long == [] and restated == []


PRODUCT = (
    "events",
    "eventlog",
    "gatewayapi",
    "reducers",
    "projections",
    "agents",
    "gateway",
    "endpoint",
    "ops",
)
CLASS_LINES = 250  # a class longer than this holds more than one job


def test_no_product_class_is_over_250_lines() -> None:
    """A class of more than 250 lines anywhere in the product is split by its jobs (the
    endpoint's rule, for every room)."""
    long = [
        f"{path.relative_to(ROOT)}:{cls.name} ({_lines(cls)})"
        for folder in PRODUCT
        for path in _modules(folder)
        for cls in _classes(path)
        if _lines(cls) > CLASS_LINES
    ]
    assert long == []


def test_the_class_rules_find_a_long_class_and_a_wide_protocol(tmp_path: Path) -> None:
    """The class rules are not vacuous."""
    wide = "class Big(Protocol):\n" + "".join(f"    def m{i}(self): ...\n" for i in range(7))
    (tmp_path / "p.py").write_text(wide)
    [cls] = _classes(tmp_path / "p.py")
    assert _protocol_methods(cls) == 7 > PROTOCOL_METHODS
    (tmp_path / "c.py").write_text("class C:\n" + "    x = 1\n" * 300)
    [cls] = _classes(tmp_path / "c.py")
    assert _lines(cls) > ENDPOINT_CLASS_LINES and _lines(cls) > CLASS_LINES


# Where a /v1/ path may be written: the client of the API, the gateway's routes, and the
# declarations of the paths both share.
API_PATHS_AT = (ROOT / "gatewayapi", ROOT / "gateway", ROOT / "events" / "wire.py")


def _api_paths(path: Path) -> list[str]:
    """The /v1/ paths a module writes: strings (or f-string pieces) that begin with
    ``/v1/`` and hold no space (help texts and prose say "/v1/stats and ..."), docstrings
    aside."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value.startswith("/v1/")
        and not any(c.isspace() for c in node.value)
    ]


def test_no_api_path_is_written_outside_the_client_and_the_routes() -> None:
    """Every call of the gateway's API inside ppf goes through gatewayapi/: no other
    product module writes a /v1/ path."""
    written = [
        f"{path.relative_to(ROOT)}: {found}"
        for folder in PRODUCT
        for path in _modules(folder)
        if not any(path == at or at in path.parents for at in API_PATHS_AT)
        for found in _api_paths(path)
    ]
    assert written == []


def test_the_api_path_rule_finds_a_path_built_by_hand(tmp_path: Path) -> None:
    """The rule is not vacuous: a path in an f-string or a plain string is found; a
    docstring, a help text and a third party's URL are not."""
    (tmp_path / "m.py").write_text(
        '"""GET /v1/stats"""\n'
        "def f(base):\n"
        '    """Asks /v1/stats."""\n'
        '    a = f"{base}/v1/leases/{x}/release"\n'
        '    b = "/v1/stats"\n'
        '    c = "/v1/stats and leases a run"\n'
        '    d = "https://example.net/api/v1/get"\n'
    )
    assert sorted(_api_paths(tmp_path / "m.py")) == ["/v1/leases/", "/v1/stats"]
