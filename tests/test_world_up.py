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

import msgspec
import pytest

import events as ev
from events.mint import fresh_id_after
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from projections.locator import lookup
from tests.helpers import check_found_as_made
from tests.test_cli import Up

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


JUDGES: list[str] = []  # the last _up_in's own judges: plain and TLS


def _stranger(url: str) -> tuple[int, bytes]:
    """What a stranger's GET of ``url`` gets (any certificate: a stranger does not pin)."""
    import ssl
    import urllib.error

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"X-Forwarded-For": "6.6.6.6"})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


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


def _up_in(world: World, ppf_bin: str, tmp_path: Path) -> Up:
    """`ppf up` beside the box, no lab mode, with the world's public judges and its own
    judge on the link address, where the world's proxies reach it (``JUDGES`` of it)."""
    judge_port, tls_port = free_port(), free_port()
    JUDGES[:] = [f"http://{LINK_HOST}:{judge_port}/judge", f"https://{LINK_HOST}:{tls_port}/judge"]
    return Up(
        ppf_bin,
        tmp_path / "data",
        "--no-seed",
        *("--judge", world.judges["httpbin"], "--judge", world.judges["azenv"]),
        *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
        *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
        *("--judge-tls-listen", f"{LINK_HOST}:{tls_port}"),
        *("--https-target", world.https_url),
    )


@pytest.mark.timeout(240)
async def test_ppf_up_outside_the_lab_serves_the_worlds_real_proxies(
    world: World, ppf_bin: str, tmp_path: Path
) -> None:
    """Every real proxy confirmed with its protocol, anonymity, exit, HTTPS capability and
    country;
    the portal, the garbage speaker and the dead never; the interceptors only when asked
    for."""
    up = _up_in(world, ppf_bin, tmp_path)
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
            check_found_as_made(got, proxy)
            assert got["https"] == proxy.https, proxy.name
            assert got["country"] == lookup(proxy.addr).country != "", proxy.name
        served = await asyncio.to_thread(_pool, up.base, "false")
        assert set(served) == {k for k, p in real.items() if not p.mitm}
        # Its agents checked through its judges; a stranger's ask of any of them, with or
        # without a nonce of its own making: 403, nothing echoed.
        for url in (up.base + "/judge", *JUDGES):
            for query in ("", "?n=w1.9999999999.aa.bb"):
                status, body = await asyncio.to_thread(_stranger, url + query)
                assert status == 403 and b"6.6.6.6" not in body and b"remote" not in body, url
        only_mitm = await asyncio.to_thread(_pool, up.base, "true")
        assert set(only_mitm) == {k for k, p in real.items() if p.mitm}
    finally:
        assert await asyncio.to_thread(up.stop) == 0


async def _as_agent(ppf_bin: str, up: Up, name: str) -> tuple[str, dict[str, Any]]:
    """Enrol ``name`` as an operator hands out a worker token: its token, and what the
    gateway tells it (``GET /v1/agents/me``): what an untrusted machine in the fleet holds."""
    issue = await asyncio.create_subprocess_exec(
        ppf_bin, "token", "issue", name, "--role", "worker", "--nats", up.nats,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(issue.communicate(), 60)
    token = out.decode().strip()
    request = urllib.request.Request(
        up.base + "/v1/agents/me", headers={"Authorization": f"Bearer {token}"}
    )
    me = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(request, timeout=5)))
    return token, me


@pytest.mark.timeout(300)
async def test_a_worker_reporting_ten_thousand_fabricated_proxies_gets_none_served(
    world: World, ppf_bin: str, tmp_path: Path
) -> None:
    """Mallory, a worker with its own token, reports 10,000 proxies that do not exist
    (ports nobody listens on, at the world's own addresses) while ppf's own agents
    harvest the world's real ones: none of Mallory's is served, its trust falls on the
    spot-checks of ppf's checker, and the real proxies are served as ever. Untested, it
    has no NATS login: its reports go through the gateway, within its bytes for the log
    (gateway/bounds.py), each stored and folded."""
    import aiohttp

    up = _up_in(world, ppf_bin, tmp_path)
    await asyncio.to_thread(up.start)
    try:
        token, me = await _as_agent(ppf_bin, up, "mallory")
        assert me["nats"] is None  # an untested agent's door is the gateway
        addrs = sorted({p.addr for p in world.proxies})
        fake = [(addrs[i % len(addrs)], 20_000 + i // len(addrs)) for i in range(10_000)]
        stored = 0
        last = ""  # ids rise, as an agent's client stamps them: else a re-send to the fold
        events = []
        for ip, port in fake:
            last = fresh_id_after(last)
            event = ev.ProxyWorked(
                id=last, agent="mallory", at=0, ip=ip, port=port, proto="http",
                latency_ms=1, anonymity="elite", exit_ip=ip,
            )  # fmt: skip
            events.append(msgspec.to_builtins(event))
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for start in range(0, len(events), 500):
                body = {"events": events[start : start + 500]}
                async with http.post(up.base + "/v1/events", json=body) as r:
                    assert r.status == 200, await r.text()
                    stored += len((await r.json())["seqs"])
        assert stored == len(fake)
        added = await asyncio.create_subprocess_exec(
            ppf_bin, "sources", "add", world.page_url, "--nats", up.nats,
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await asyncio.wait_for(added.wait(), 60) == 0
        real = {f"{p.addr}:{p.port}" for p in world.proxies}
        fakes = {f"{ip}:{port}" for ip, port in fake}
        deadline = time.monotonic() + 200
        mallory: dict[str, Any] = {}
        pool: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and (
            mallory.get("trust") != "fallen" or set(pool) != real
        ):
            agents = await asyncio.to_thread(_json, up.base + "/v1/agents")
            mallory = next(a for a in agents["agents"] if a["name"] == "mallory")
            pool = await asyncio.to_thread(_pool_alive, up.base)
            assert not set(pool) & fakes, "a fabricated proxy was served"
            await asyncio.sleep(1)
        assert mallory["trust"] == "fallen", mallory
        assert mallory["spot_failed"] >= 10 > mallory["spot_checks"] - mallory["spot_failed"]
        assert set(pool) == real  # the honest harvest, whole
        waiting = await asyncio.to_thread(
            _json, up.base + "/v1/proxies?limit=0&status=unconfirmed&mitm=any"
        )
        seen = {f"{p['ip']}:{p['port']}" for p in waiting["proxies"]}
        assert seen and seen <= fakes  # kept for the record, never served
        stats = await asyncio.to_thread(_json, up.base + "/v1/stats")
        assert stats["applied_seq"] >= stored
    finally:
        assert await asyncio.to_thread(up.stop) == 0


def _pool_alive(base: str) -> dict[str, dict[str, Any]]:
    return {
        f"{p['ip']}:{p['port']}": p for p in _json(base + "/v1/proxies?limit=0&mitm=any")["proxies"]
    }
