"""The world in a box: public proxies, judges and dead addresses in their own namespace.

What it shows is what the loopback lab hid: a public proxy asked for our loopback judge
reaches its own loopback, so only a judge the world can reach confirms anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from agents.check import Judge, check
from agents.https import tunnels_https
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from tests.helpers import ppf_judge_app

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with World(tmp_path_factory.mktemp("world")) as w:
        yield w


@pytest.fixture
async def loopback_judge(tmp_path: Path) -> AsyncIterator[str]:
    """ppf's judge on our own loopback, as `ppf up` used to hand its agents (the operator's
    nonces from tmp_path's judge.key)."""
    app, _ = ppf_judge_app(tmp_path / "judge.key")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/judge"
    await runner.cleanup()


async def test_public_judges_confirm_every_real_proxy_in_any_format(world: World) -> None:
    """Through httpbin and azenv judges alike: protocol, anonymity and exit of each proxy."""
    for url in world.judges.values():
        judge = await Judge.discover(url)
        assert judge.own_ip == LINK_HOST, url
        for proxy in world.proxies:
            result = await check(proxy.addr, proxy.port, None, judge, timeout=5)
            assert result.ok, (url, proxy.name, result.error)
            got = (result.proto, result.anonymity, result.exit_ip)
            assert got == (proxy.proto, proxy.anonymity, proxy.exit_ip), (url, proxy.name)
            assert result.mitm == (proxy.mitm == "body"), (url, proxy.name)


async def test_a_public_proxy_never_reaches_our_loopback_judge(
    world: World, loopback_judge: str, tmp_path: Path
) -> None:
    """Asked for 127.0.0.1, a public proxy fetches its own loopback: nothing is confirmed."""
    judge = await Judge.discover(loopback_judge, signer=ppf_judge_app(tmp_path / "judge.key")[1])
    results = await asyncio.gather(
        *(check(p.addr, p.port, p.proto, judge, timeout=5) for p in world.proxies)
    )
    assert [r.addr for r in results if r.ok] == []


async def test_dead_addresses_come_in_three_kinds_and_fakes_are_not_proxies(
    world: World,
) -> None:
    """Refused at once, silent until the timeout, accepted and never answered; a portal
    and a garbage speaker answer, but not as the judge: none of them works."""
    judge = await Judge.discover(world.judges["httpbin"])
    refusing = await check(*world.refusing[0], "http", judge, timeout=3)
    assert not refusing.ok and "Connection" in refusing.error, refusing
    for addr in (world.silent[0], world.tarpits[0]):
        dead = await check(*addr, "http", judge, timeout=1.5)
        assert not dead.ok and "Timeout" in dead.error, (addr, dead)
    for addr in (world.portal, world.garbage):
        fake = await check(*addr, None, judge, timeout=3)
        assert not fake.ok, (addr, fake)
    portal = await check(*world.portal, "http", judge, timeout=3)
    assert portal.error == "not the judge's answer"


async def test_https_capability_is_a_tunnel_to_a_real_tls_endpoint(world: World) -> None:
    """Every proxy that tunnels carries TLS to the box's HTTPS endpoint; the page rewriter,
    which refuses CONNECT, does not."""
    for proxy in world.proxies:
        assert proxy.proto is not None
        carried = await tunnels_https(proxy.addr, proxy.port, proxy.proto, world.https_url, 5)
        assert carried == (proxy.https == "yes"), proxy.name


async def test_each_proxy_has_its_round_trip(world: World) -> None:
    """The box adds each proxy's own round trip: a check through it takes at least that."""
    judge = await Judge.discover(world.judges["httpbin"])
    for proxy in world.proxies:
        result = await check(proxy.addr, proxy.port, proxy.proto, judge, timeout=5)
        assert result.ok and result.latency_ms >= proxy.rtt_ms, (proxy.name, result)


async def test_a_loopback_judge_is_never_used_for_a_public_proxy(
    world: World, loopback_judge: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ppf's loopback judge named first in the pool, every public proxy is checked
    through a public judge; without the reachability rule, checks through it fail."""
    from agents import judgepool
    from agents.check import check_many

    targets = [(p.addr, p.port, p.proto) for p in world.proxies]
    agent, key = ppf_judge_app(tmp_path / "judge.key")[1]  # the fixture's key: its nonces
    judges = [loopback_judge, world.judges["httpbin"]]
    pool = await judgepool.JudgePool(judges, own=[loopback_judge], agent=agent, key=key).start()
    try:
        results = await check_many(targets, pool, timeout=5)
        assert all(r.ok for r in results), [r.error for r in results]
        assert {r.judge for r in results} == {world.judges["httpbin"]}
        monkeypatch.setattr(judgepool, "is_public_host", lambda host: True)
        for state in pool.states:  # the rule read at pick time: now every judge "fits"
            state.healthy = True
        results = await check_many(targets, pool, timeout=5)
        through_loopback = [r for r in results if r.judge == loopback_judge]
        assert through_loopback and not any(r.ok for r in through_loopback)
    finally:
        await pool.stop()


@pytest.fixture
async def public_ppf_judge(tmp_path: Path) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """ppf's own judge where the box reaches it (our end of the link), as --public-url;
    it answers the operator's nonces from tmp_path's judge.key (``ppf check --data``)."""
    app, _ = ppf_judge_app(tmp_path / "judge.key")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server = runner.server
    assert server is not None
    port = free_port()
    await web.TCPSite(runner, LINK_HOST, port).start()
    yield f"http://{LINK_HOST}:{port}/judge", runner
    await runner.cleanup()
    # A connection accepted while the judge stopped (a health check's, when a test kills
    # it) joins the server after its shutdown closed the ones it knew, and stays open; a
    # close takes the loop a few rounds more. Twice the test's loop ended first, and its
    # transport was reported unclosed at this teardown.
    for late in server.connections:
        late.force_close()
    await asyncio.sleep(0.1)


async def test_ppf_check_gives_one_answer_through_every_judge_format(
    world: World, ppf_bin: str, public_ppf_judge: tuple[str, web.AppRunner], tmp_path: Path
) -> None:
    """`ppf check` through ppf's judge, an httpbin and an azenv judge: the same protocol,
    anonymity and exit address for every proxy."""
    addrs = [f"{p.addr}:{p.port}" for p in world.proxies]
    answers = {}
    for url in (public_ppf_judge[0], *world.judges.values()):
        proc = await asyncio.create_subprocess_exec(
            ppf_bin, "check", *addrs, "--judge", url, "--json", "--timeout", "5",
            "--data", str(tmp_path),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        rows = [json.loads(line) for line in out.splitlines()]
        answers[url] = [(r["ok"], r["proto"], r["anonymity"], r["exit_ip"]) for r in rows]
    truth = [(True, p.proto, p.anonymity, p.exit_ip) for p in world.proxies]
    assert all(got == truth for got in answers.values()), answers


async def test_a_judge_killed_mid_run_is_benched_and_costs_no_proxy(
    world: World, public_ppf_judge: tuple[str, web.AppRunner], tmp_path: Path
) -> None:
    """Our judge stops answering between two rounds of checks: within one health period
    it is benched, the checks that failed through it are void (never a proxy's
    failure), and the next round goes through the box's public judge."""
    from agents.check import check_many
    from agents.judgepool import JudgePool

    url, runner = public_ppf_judge
    targets = [(p.addr, p.port, p.proto) for p in world.proxies]
    agent, key = ppf_judge_app(tmp_path / "judge.key")[1]
    judges = [url, world.judges["httpbin"]]
    pool = await JudgePool(judges, own=[url], health_every_s=1, agent=agent, key=key).start()
    try:
        first = await check_many(targets, pool, timeout=5)
        assert all(r.ok and r.judge == url for r in first)
        await runner.cleanup()  # the judge dies
        during = await check_many(targets, pool, timeout=5)
        assert all(r.ok or r.void for r in during), [(r.addr, r.error) for r in during]
        benched = time.monotonic()
        while pool.states[0].healthy and time.monotonic() - benched < 5:
            await asyncio.sleep(0.1)
        assert not pool.states[0].healthy  # within the health period (1 s) and a poll
        after = await check_many(targets, pool, timeout=5)
        assert all(r.ok and r.judge == world.judges["httpbin"] for r in after)
    finally:
        await pool.stop()
