"""`ppf up` with no lab mode, in the world in a box: one source page lists every proxy
there, dead ones and fakes; the pool that comes out is the world's truth."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.geo import lookup
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from tests.test_cli import Up

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _pool(base: str, mitm: str) -> dict[str, dict[str, Any]]:
    url = base + f"/v1/proxies?limit=0&status=all&mitm={mitm}"
    return {f"{p['ip']}:{p['port']}": p for p in _json(url)["proxies"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with World(tmp_path_factory.mktemp("world-up")) as w:
        yield w


@pytest.mark.timeout(240)
async def test_ppf_up_outside_the_lab_serves_the_worlds_real_proxies(
    world: World, ppf_bin: str, tmp_path: Path
) -> None:
    """Every real proxy confirmed with its protocol, anonymity, exit, HTTPS capability and
    country;
    the portal, the garbage speaker and the dead never; the interceptors only when asked
    for."""
    judge_port, tls_port = free_port(), free_port()
    up = Up(
        ppf_bin,
        tmp_path / "data",
        "--no-seed",
        *("--judge", world.judges["httpbin"], "--judge", world.judges["azenv"]),
        *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
        *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
        *("--judge-tls-listen", f"{LINK_HOST}:{tls_port}"),
        *("--https-target", world.https_url),
    )
    await asyncio.to_thread(up.start)
    try:
        added = await asyncio.create_subprocess_exec(
            ppf_bin, "sources", "add", world.page_url, "--nats", up.nats,
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await asyncio.wait_for(added.wait(), 60) == 0
        real = {f"{p.addr}:{p.port}": p for p in world.proxies}
        deadline = time.monotonic() + 180
        pool: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and (
            set(pool) != set(real) or not all(p["country"] for p in pool.values())
        ):
            pool = await asyncio.to_thread(_pool, up.base, "any")
            await asyncio.sleep(1)
        assert set(pool) == set(real), (sorted(pool), sorted(real))  # no fake, none missed
        for key, proxy in real.items():
            got = pool[key]
            assert (got["proto"], got["anonymity"], got["exit_ip"]) == (
                proxy.proto,
                proxy.anonymity,
                proxy.exit_ip,
            ), proxy.name
            assert got["mitm"] == bool(proxy.mitm), proxy.name
            assert got["https"] == proxy.https, proxy.name
            assert got["country"] == lookup(proxy.addr).country != "", proxy.name
        served = await asyncio.to_thread(_pool, up.base, "false")
        assert set(served) == {k for k, p in real.items() if not p.mitm}
        only_mitm = await asyncio.to_thread(_pool, up.base, "true")
        assert set(only_mitm) == {k for k, p in real.items() if p.mitm}
    finally:
        assert await asyncio.to_thread(up.stop) == 0
