"""The checker: recheck shards leased from a real gateway, real proxies re-tested."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import events as ev
from agents.checker import Checker, CheckerConfig, fitted_timeout
from agents.gateway_client import GatewayClient
from eventlog.client import Log, fresh_id, now_ms
from gateway.app import judge as judge_handler
from gateway.app import make_app
from gateway.http import GatewayConfig
from gateway.judge import JUDGE_DOOR, JudgeDoor, JudgeKeys
from ops.cli import enroll
from ops.lab.testbed import LOOPBACK_EXITS, Proxy, ProxyLab
from projections.core.recheck import RecheckPolicy, due_in_shard
from projections.live import FoldService
from reducers import ProxyRow
from tests.helpers import shop_refusing, worked

NOW = 1_800_000_000_000


def _row(**kw: object) -> ProxyRow:
    fields: dict[str, object] = {
        "ip": "8.8.8.8",
        "port": 80,
        "proto": "http",
        "protos": ("http",),
        "first_seen": NOW,
        "last_seen": NOW,
    }
    fields.update(kw)
    return ProxyRow(**fields)  # type: ignore[arg-type]


def test_graduated_intervals_and_asn_spread() -> None:
    """Rechecks follow graduated intervals and interleave networks."""
    policy = RecheckPolicy(failing_s=60, fresh_s=600, settled_s=3600, veteran_s=7200)
    failing = _row(ip="1.1.1.1", fail_streak=1, confirmations=9)
    fresh = _row(ip="1.1.1.2", confirmations=1)
    settled = _row(ip="1.1.1.3", confirmations=9)
    veteran = _row(ip="1.1.1.4", confirmations=9, first_seen=NOW - 2 * 86_400_000)
    rows = [failing, fresh, settled, veteran]
    at = {61: {"1.1.1.1"}, 601: {"1.1.1.1", "1.1.1.2"}, 3601: {"1.1.1.1", "1.1.1.2", "1.1.1.3"}}
    for seconds, want in at.items():
        assert {r.ip for r in due_in_shard(rows, NOW + seconds * 1000, 100, policy)} == want
    assert len(due_in_shard(rows, NOW + 7201 * 1000, 100, policy)) == 4
    spread = [_row(ip=f"2.2.2.{i}", asn=i % 2) for i in range(6)]
    order = [r.asn for r in due_in_shard(spread, NOW + 10**9, 4, policy)]
    assert order == [0, 1, 0, 1]


def test_without_asns_rechecks_spread_across_slash16_networks() -> None:
    """Unknown ASNs (no enrichment yet): the /16 stands in, so one range is not all first."""
    rows = [_row(ip=f"5.5.{i}.1", port=80 + i) for i in range(4)]  # one /16, most overdue
    rows += [_row(ip="6.6.0.1", last_seen=NOW + 1000), _row(ip="7.7.0.1", last_seen=NOW + 2000)]
    picked = [r.ip for r in due_in_shard(rows, NOW + 10**9, 3, RecheckPolicy())]
    assert picked == ["5.5.0.1", "6.6.0.1", "7.7.0.1"]


def test_a_recheck_waits_for_a_proxy_as_its_own_checks_say() -> None:
    """Three times the proxy's latency EMA, within the floor and the check timeout; the
    whole timeout where the latency is unknown or the fit is off."""
    cfg = CheckerConfig(check_timeout_s=5.0, fit_timeout=3.0, fit_floor_s=2.0)
    assert fitted_timeout(300, cfg) == 2.0  # a fast proxy: the floor
    assert fitted_timeout(1_000, cfg) == 3.0
    assert fitted_timeout(4_000, cfg) == 5.0  # a slow one: never past the check timeout
    assert fitted_timeout(0, cfg) == 5.0  # unknown
    assert fitted_timeout(1_000, dataclasses.replace(cfg, fit_timeout=0)) == 5.0


async def test_a_recheck_lease_carries_each_proxys_latency(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """The gateway sends, with each due proxy, its latency EMA in the same order: what
    the checker fits its timeout to."""
    known = [p for p in lab.proxies if p.name in ("squid", "microsocks")]
    async with _rechecks(log_client, known) as r:
        gw = GatewayClient(r.gateway, r.token, "c1", tmp_path / "outbox.jsonl", http_only=True)
        async with gw:
            grants = await gw.lease("recheck", 256, 60)
        payloads = [g.recheck() for g in grants]
        got = {
            (ip, port): latency
            for p in payloads
            for (ip, port, _), latency in zip(p.proxies, p.latency_ms, strict=True)
        }
        rows = r.fold.state.proxies
        assert got == {key: round(rows[key].latency_ema) for key in got}
        assert len(got) == 2 and all(v > 0 for v in got.values())


@dataclass
class _Rechecks:
    fold: FoldService
    gateway: str  # base URL
    token: str  # of the checker "c1"


@contextlib.asynccontextmanager
async def _rechecks(log_client: Log, known: list[Proxy]) -> AsyncIterator[_Rechecks]:
    """A checker "c1" enrolled, ``known`` proxies confirmed once, a fold, and a gateway
    whose recheck policy makes every known proxy due at once."""
    token = await enroll(log_client, "c1", "checker")
    await log_client.publish(
        ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(lab=True))
    )
    for p in known:
        await log_client.publish(worked("127.0.0.1", p.port, proto=p.proto or "http"))
    fold = FoldService(log_client, db=None)
    await fold.start()
    assert await fold.wait_for(await log_client.head_seq(), 10)
    now_policy = RecheckPolicy(failing_s=0, fresh_s=0, settled_s=0, veteran_s=0)
    server = TestServer(make_app(fold, log_client, GatewayConfig(recheck=now_policy)))
    await server.start_server()
    try:
        yield _Rechecks(fold, str(server.make_url("")).rstrip("/"), token)
    finally:
        await server.close()
        await fold.stop()


async def test_checker_rechecks_known_proxies_both_ways(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """A checker confirms live proxies and reports dead ones as ProxyFailed."""
    known = [p for p in lab.proxies if p.name in ("squid", "microsocks", "closed")]
    async with _rechecks(log_client, known) as r:
        config = CheckerConfig(shards=256, check_timeout_s=3, idle_s=0.1)
        checker = Checker(r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c1", config)
        # Only shards with due proxies are leased: one cycle covers the three proxies.
        await asyncio.wait_for(checker.run(asyncio.Event(), cycles=1), 60)
        assert checker.rechecked == 3
        assert await r.fold.wait_for(await log_client.head_seq(), 10)
        state = r.fold.state
        by_name = {p.name: state.proxies[("127.0.0.1", p.port)] for p in known}
        assert by_name["squid"].confirmations == 2 and by_name["squid"].fail_streak == 0
        assert by_name["microsocks"].confirmations == 2
        assert by_name["closed"].fail_streak == 1 and by_name["closed"].confirmations == 1
        assert all(row.status == "free" for row in state.leases.values() if row.kind == "recheck")


async def test_a_judge_outage_marks_no_proxy_dead(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """The judge answers the checker's start, then fails: every check fails, but the
    judge fails directly too, so no `ProxyFailed` is published and the shards go back
    uncounted."""
    known = [p for p in lab.proxies if p.name in ("squid", "microsocks")]
    answered = 0

    async def failing_judge(request: web.Request) -> web.StreamResponse:
        nonlocal answered
        answered += 1
        if answered > 1:  # the discovery only
            raise web.HTTPServiceUnavailable()
        return await judge_handler(request)

    keys = JudgeKeys.load(tmp_path / "judge.key")
    judge_app = web.Application()
    judge_app[JUDGE_DOOR] = JudgeDoor(keys, lambda name: name == "c1")
    judge_app.router.add_get("/judge", failing_judge)
    judge_server = TestServer(judge_app, host="127.0.0.1")
    await judge_server.start_server()
    stop = asyncio.Event()
    try:
        async with _rechecks(log_client, known) as r:
            judge = str(judge_server.make_url("/judge"))
            config = CheckerConfig(
                shards=256,
                check_timeout_s=3,
                idle_s=30,
                own_judges=(judge,),
                judge_key=keys.agent_key("c1").hex(),
            )
            checker = Checker(r.gateway, r.token, "c1", judge, tmp_path / "c1", config)
            task = asyncio.create_task(checker.run(stop))
            for _ in range(300):
                if checker.voided:
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.wait_for(task, 30)
            assert checker.voided == 1
            assert await r.fold.wait_for(await log_client.head_seq(), 10)
            state = r.fold.state
            for p in known:
                row = state.proxies[("127.0.0.1", p.port)]
                assert (row.fail_streak, row.confirmations) == (0, 1), p.name
            recheck = [row for row in state.leases.values() if row.kind == "recheck"]
            assert recheck and all((x.status, x.attempts) == ("free", 0) for x in recheck)
            assert "ProxyFailed" not in state.agents["c1"].counts
    finally:
        await judge_server.close()


@pytest.mark.timeout(120)
async def test_heartbeats_keep_a_recheck_longer_than_its_lease(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """A known proxy turned tarpit holds the recheck for 14 s, over a 10 s lease: the
    heartbeats keep the shard, released `done` by its holder, no attempt counted."""
    tarpit = next(p for p in lab.proxies if p.name == "tarpit")
    tarpit_as_http = dataclasses.replace(tarpit, proto="http")  # known as an HTTP proxy
    async with _rechecks(log_client, [tarpit_as_http]) as r:
        config = CheckerConfig(
            shards=256, check_timeout_s=14, lease_ttl_s=10, idle_s=0.1, fit_timeout=0
        )
        checker = Checker(r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c1", config)
        await asyncio.wait_for(checker.run(asyncio.Event(), cycles=1), 60)
        assert await r.fold.wait_for(await log_client.head_seq(), 10)
        [shard] = [row for row in r.fold.state.leases.values() if row.kind == "recheck"]
        assert (shard.status, shard.attempts, shard.lost) == ("free", 0, 0)
        assert r.fold.state.proxies[("127.0.0.1", tarpit.port)].fail_streak == 1


async def test_an_idle_checker_moves_off_a_dead_gateway_within_a_heartbeat(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """A checker with nothing to recheck, told two gateways, the first killed: it asks
    again within a third of its 3 s lease TTL, not its 30 s idle wait, and moves to the
    second (it holds no lease whose heartbeat would have told it)."""
    from structlog.testing import capture_logs

    async with _rechecks(log_client, []) as r:
        first = TestServer(make_app(r.fold, log_client, GatewayConfig()))
        await first.start_server()
        a = str(first.make_url("")).rstrip("/")
        config = CheckerConfig(shards=256, lease_ttl_s=3, idle_s=30)
        checker = Checker(f"{a},{r.gateway}", r.token, "c1", a + "/judge", tmp_path / "c1", config)
        stop = asyncio.Event()
        with capture_logs() as logs:
            running = asyncio.create_task(checker.run(stop))
            try:
                await asyncio.sleep(1.5)  # it has asked the first, found nothing, and waits
                assert not any(e["event"] == "gateway_failover" for e in logs)
                await first.close()
                killed = asyncio.get_running_loop().time()
                while not any(e["event"] == "gateway_failover" for e in logs):
                    assert asyncio.get_running_loop().time() - killed < 1.5, "still waiting"
                    await asyncio.sleep(0.05)
            finally:
                stop.set()
                await asyncio.wait_for(running, 10)
        [moved] = [e for e in logs if e["event"] == "gateway_failover"]
        assert (moved["gone"], moved["to"]) == (a, r.gateway)


async def test_a_cycle_leases_shards_until_it_holds_its_batch(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """In a small pool a shard holds a proxy or none: a cycle leasing one shard at a
    time goes on leasing until it holds its batch, so one cycle rechecks every due
    proxy (it rechecked one before), and stops once the batch is full."""
    by_shard = {ev.shard_of("127.0.0.1", p.port): p for p in lab.proxies}
    known = list(by_shard.values())[:3]  # three proxies, each in a shard of its own
    assert len(known) == 3
    async with _rechecks(log_client, known) as r:
        config = CheckerConfig(shards=1, check_timeout_s=3, idle_s=0.1)
        checker = Checker(r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c1", config)
        await asyncio.wait_for(checker.run(asyncio.Event(), cycles=1), 60)
        assert checker.rechecked == 3
        small = dataclasses.replace(config, batch=2)
        again = Checker(r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c2", small)
        await asyncio.wait_for(again.run(asyncio.Event(), cycles=1), 60)
        assert again.rechecked == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="a site on port 80 of 127.0.0.61: run as root")
async def test_a_probe_of_a_shard_that_ends_first_is_read_with_the_rounds_later_answers(
    lab: ProxyLab, log_client: Log, tmp_path: Path
) -> None:
    """A site of the consumers' traffic without a rule gives squid's exit its page at
    once and tinyproxy-via's a 403 a second later, each proxy in a shard of its own.
    Squid's shard ends first, when its page had nothing to be told from; its probe is
    read again once the round's other probes are in, so the page is ``through`` (read at
    its shard's end, it said nothing, and a probe of that proxy and site is not handed
    out again for a quarter of an hour: ``test_sites_box`` missed three proxies of its
    403 site so, in three runs of 41)."""
    from reducers import sites

    site = "127.0.0.61"

    server = await shop_refusing(LOOPBACK_EXITS["tinyproxy-via"], site, 80, delay_s=1.0)
    known = [p for p in lab.proxies if p.name in ("squid", "tinyproxy-via")]
    assert len({ev.shard_of("127.0.0.1", p.port) for p in known}) == 2
    try:
        async with _rechecks(log_client, known) as r:
            await enroll(log_client, "edge", "endpoint")
            settings = ev.Settings(lab=True, trusted_agents=("c1",))  # c1: the operator's
            await log_client.publish(
                ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=settings)
            )
            elite = next(p for p in lab.proxies if p.name == "tinyproxy-elite")
            went = ev.SiteResult(ip="127.0.0.1", port=elite.port, site=site)  # no verdict
            await log_client.publish(
                ev.SitesChecked(
                    id=fresh_id(), agent="edge", at=now_ms(), key="traffic", results=[went]
                )
            )
            assert await r.fold.wait_for(await log_client.head_seq(), 10)
            config = CheckerConfig(shards=256, check_timeout_s=3, idle_s=0.1)
            checker = Checker(
                r.gateway, r.token, "c1", r.gateway + "/judge", tmp_path / "c1", config
            )
            await asyncio.wait_for(checker.run(asyncio.Event(), cycles=1), 60)
            assert checker.probed == 2
            assert await r.fold.wait_for(await log_client.head_seq(), 10)
            by_name = {p.name: sites.cell(r.fold.state, ("127.0.0.1", p.port), site) for p in known}
    finally:
        await server.close()
    squid, refused = by_name["squid"], by_name["tinyproxy-via"]
    assert refused is not None and (refused.through, refused.blocked) == (0, 1), refused
    assert squid is not None and (squid.through, squid.blocked) == (1, 0), squid
