"""The proxy lab itself: a daemon whose port was taken before it could bind it.

Between ``free_port`` naming a port and the daemon binding it, another test's socket
can take it (CI saw microsocks exit 1, "Address already in use", and the lab's other
daemons outlive the failed fixture). Here the port is taken on purpose: a socket bound
to it and not listening, as an outgoing connection's local end would be.
"""

from __future__ import annotations

import socket
from collections.abc import Container, Iterator
from pathlib import Path

import pytest

from ops.lab import testbed
from ops.lab.testbed import TRIES, ProxyLab, missing
from ops.nats.server import free_port

DAEMONS = ("squid", "tinyproxy-via", "tinyproxy-elite", "microsocks", "dante")


@pytest.fixture
def taken() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


def _hand_out(monkeypatch: pytest.MonkeyPatch, port: int, calls: set[int]) -> None:
    """``free_port`` in the lab answers ``port`` on the given calls (1-based)."""
    count = 0

    def fake(host: str = "127.0.0.1", avoid: Container[int] = ()) -> int:
        nonlocal count
        count += 1
        return port if count in calls else free_port(host, avoid)

    monkeypatch.setattr(testbed, "free_port", fake)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _daemons_installed() -> None:
    if absent := missing():
        pytest.skip(f"proxy servers missing: apt-get install {' '.join(absent)} (make test does)")


def test_a_daemon_that_lost_its_port_starts_again_on_another(
    monkeypatch: pytest.MonkeyPatch, taken: int, tmp_path: Path
) -> None:
    """squid's first port is taken: it exits, is started again on a fresh port, and
    the lab comes up whole, every daemon listening."""
    _hand_out(monkeypatch, taken, {1})  # squid's port, the first one asked for
    lab = ProxyLab(tmp_path / "lab").start()
    try:
        daemons = {p.name: p for p in lab.proxies if p.name in DAEMONS}
        assert set(daemons) == set(DAEMONS)
        assert daemons["squid"].port != taken
        assert all(_listens(p.port) for p in daemons.values())
        assert all(p.proc is not None and p.proc.poll() is None for p in daemons.values())
    finally:
        lab.stop()


def test_a_lab_that_cannot_start_says_which_daemon_and_leaves_nothing_running(
    monkeypatch: pytest.MonkeyPatch, taken: int, tmp_path: Path
) -> None:
    """squid gets the taken port on every try: the lab's error names it, and the
    daemons that did start are ended with it, not left to outlive the fixture."""
    # Calls 2-5 are the other daemons' first ports; squid's every try gets the taken one.
    _hand_out(monkeypatch, taken, {1, *range(6, 6 + TRIES - 1)})
    lab = ProxyLab(tmp_path / "lab")
    with pytest.raises(RuntimeError, match=r"^squid: exited with"):
        lab.start()
    others = [p for p in lab.proxies if p.name in DAEMONS[1:]]
    assert len(others) == len(DAEMONS) - 1
    assert all(p.proc is not None and p.proc.poll() is not None for p in others)
    assert not any(_listens(p.port) for p in others)
