"""Exclusive checkout (gateway/checkout.py): proxies held by one consumer at a time,
arbitrated by the log through any number of gateways, found again by idempotency key."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec

import events as ev
from eventlog.client import Log
from eventlog.stream import Firehose
from events.batches import group
from events.mint import fresh_id, now_ms
from gateway.http import GatewayConfig
from ops.cli.admin import enroll
from ops.nats.server import NatsServer
from tests.fleet import serving
from tests.folded import FoldedLog, ip
from tests.helpers import eid

POOL = 60


@contextlib.asynccontextmanager
async def _gateways(
    lg: Log, consumers: int, pool: int = POOL
) -> AsyncIterator[tuple[list[str], list[str]]]:
    """Two gateways over one log, a guarded fleet with ``pool`` served proxies and
    ``consumers`` consumer tokens: (gateway URLs, tokens)."""
    settings = ev.Settings(
        agent_subjects=True, trust=True, trusted_agents=("c-own",), guarded=True, batches=True
    )
    await lg.publish(ev.Configured(id=fresh_id(), agent="admin", at=now_ms(), settings=settings))
    await enroll(lg, "c-own", "checker")
    tokens = [await enroll(lg, f"shop{i:02d}", "consumer") for i in range(consumers)]
    worked = [
        ev.ProxyWorked(
            id=fresh_id(), agent="c-own", at=now_ms(), ip=ip(i), port=8080, proto="http",
            latency_ms=10 + i,
        )
        for i in range(pool)
    ]  # fmt: skip
    for event in group(worked):
        await lg.publish_raw(ev.agent_subject(event), ev.encode(event), msg_id=event.id)
    async with (
        serving(lg, GatewayConfig(rate_per_s=10_000, burst=10_000)) as (a, _),
        serving(lg, GatewayConfig(rate_per_s=10_000, burst=10_000)) as (b, _),
    ):
        yield [str(c.make_url("")).rstrip("/") for c in (a, b)], tokens


async def _post(http: aiohttp.ClientSession, url: str, token: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json(content_type=None)


async def test_fifty_consumers_through_two_gateways_never_share_a_proxy(
    log_client: Log, nats_server: NatsServer
) -> None:
    """50 consumers check out 2 proxies each, at once, again and again, through either of
    two gateways, releasing most: walked in log order, no proxy was held by two consumers
    at the same moment; what is held is served to nobody else."""
    rng = random.Random(7)
    handed: dict[str, str] = {}  # lease -> consumer, as the gateways answered
    async with _gateways(log_client, 50) as (gateways, tokens), aiohttp.ClientSession() as http:

        async def consumer(i: int) -> None:
            for _ in range(4):
                base = rng.choice(gateways)
                status, body = await _post(http, f"{base}/v1/checkout", tokens[i], {"count": 2})
                assert status == 200, body
                for p in body["proxies"]:
                    handed[p["lease"]] = f"shop{i:02d}"
                if body["proxies"] and rng.random() < 0.7:
                    url = f"{rng.choice(gateways)}/v1/checkout/{body['checkout']}/release"
                    status, _ = await _post(http, url, tokens[i], {})
                    assert status == 200

        await asyncio.gather(*(consumer(i) for i in range(50)))
        async with http.get(f"{gateways[0]}/v1/proxies?limit=0") as r:
            served = {p["ip"] for p in (await r.json())["proxies"]}
        head = await log_client.head_seq()
    assert len(handed) >= POOL  # the pool was handed out over and over
    holder: dict[str, tuple[str, str, int]] = {}  # target -> (lease, consumer, expires)
    overlaps = []
    async for batch in Firehose(nats_server.url).batches(until=head):
        for _seq, ts, _subject, payload in batch:
            event = ev.decode(payload)
            if isinstance(event, ev.Leased) and event.kind == "proxy" and event.lease in handed:
                held = holder.get(event.target)
                if held is not None and ts <= held[2] and held[1] != handed[event.lease]:
                    overlaps.append((event.target, held, event.lease))
                holder[event.target] = (event.lease, handed[event.lease], ts + event.ttl_s * 1000)
            elif isinstance(event, ev.Released) and event.kind == "proxy":
                held = holder.get(event.target)
                if held is not None and held[0] == event.lease:
                    del holder[event.target]
    assert not overlaps, overlaps[:3]
    still = {ev.proxy_of(t)[0] for t in holder}
    assert still and not still & served  # held now: served to nobody


async def test_the_same_key_gets_the_same_checkout_and_release_reports(log_client: Log) -> None:
    """The same idempotency key, on the other gateway, later: the same proxies; another
    consumer's checkout gets others; past the cap, 429; a release gives them back and its
    failed outcome is the consumer's report; /pop/ is a checkout of one."""
    async with _gateways(log_client, 2) as (gateways, tokens), aiohttp.ClientSession() as http:
        body = {"count": 3, "idempotency_key": "run-42", "ttl_s": 600}
        status, first = await _post(http, f"{gateways[0]}/v1/checkout", tokens[0], body)
        assert status == 200 and len(first["proxies"]) == 3
        status, again = await _post(http, f"{gateways[1]}/v1/checkout", tokens[0], body)
        assert status == 200 and again["checkout"] == first["checkout"]
        assert [p["lease"] for p in again["proxies"]] == [p["lease"] for p in first["proxies"]]
        status, other = await _post(http, f"{gateways[1]}/v1/checkout", tokens[1], body)
        mine = {(p["ip"], p["port"]) for p in first["proxies"]}
        assert status == 200 and not mine & {(p["ip"], p["port"]) for p in other["proxies"]}
        async with http.get(f"{gateways[0]}/pop/") as r:
            popped = await r.json()
        assert popped["proxy"] not in {f"{i}:{p}" for i, p in mine}
        bad = first["proxies"][0]
        url = f"{gateways[1]}/v1/checkout/{first['checkout']}/release"
        status, done = await _post(
            http, url, tokens[0], {"outcomes": {f"{bad['ip']}:{bad['port']}": "failed"}}
        )
        assert status == 200 and (done["released"], done["reported"]) == (3, 1)
        status, later = await _post(http, f"{gateways[0]}/v1/checkout", tokens[0], body)
        assert [p["lease"] for p in later["proxies"]] == [p["lease"] for p in first["proxies"]]
        assert not any(p["held"] for p in later["proxies"])  # released: the record stays
        status, _ = await _post(http, f"{gateways[0]}/v1/checkout", tokens[0], {"count": 101})
        assert status == 400


def test_a_checkout_is_found_by_its_key_for_a_day_of_log_time() -> None:
    """What keeps the answer is the fold's state, not the stream's duplicate window:
    25 hours of log time later (past any window), the checkout is there; past 48 it is
    forgotten when the next checkouts are recorded."""
    log = FoldedLog(guarded=True)
    log.enrol("shop", "consumer")
    log.report("c-own", ip(1), at_s=1)
    target = ev.proxy_token(ip(1), 8080)

    def lease(checkout: str, at_s: float) -> None:
        lid = eid()
        log.service(
            ev.Leased(id=lid, agent="shop", at=0, lease=lid, kind="proxy", target=target,
                      ttl_s=60, checkout=checkout),
            at_s=at_s,
        )  # fmt: skip

    lease("c1", at_s=2)
    assert log.state.checkouts["c1"].consumer == "shop"
    assert msgspec.json.encode(log.state.checkouts["c1"])
    log.report("c-own", ip(1), at_s=25 * 3_600)
    assert "c1" in log.state.checkouts
    for n in range(70):
        lease(f"later{n}", at_s=49 * 3_600 + n * 120)
    assert "c1" not in log.state.checkouts


async def test_a_checkout_past_its_ttl_is_served_again(log_client: Log) -> None:
    """A checkout nobody releases ends with its TTL (10 s, the shortest): the proxy is
    served again though no event has touched its lease since."""
    async with _gateways(log_client, 1) as (gateways, tokens), aiohttp.ClientSession() as http:
        status, got = await _post(
            http, f"{gateways[0]}/v1/checkout", tokens[0], {"count": 1, "ttl_s": 10}
        )
        assert status == 200
        taken = got["proxies"][0]["ip"]

        async def served() -> set[str]:
            async with http.get(f"{gateways[0]}/v1/proxies?limit=0") as r:
                return {p["ip"] for p in (await r.json())["proxies"]}

        assert taken not in await served()
        await asyncio.sleep(max(0.0, got["proxies"][0]["expires_at"] / 1000 - time.time()) + 1)
        assert taken in await served()


async def test_the_cap_is_reached_by_holding_not_by_asking(log_client: Log) -> None:
    """A consumer holds 100 proxies (60, then 40 more, through either gateway): the
    101st is a 429 naming the cap, on both gateways; releasing the first checkout makes
    room again. (A count of 101 in one ask is a parameter's 400, not the cap.)"""
    fleet = _gateways(log_client, 1, pool=120)
    async with fleet as (gateways, tokens), aiohttp.ClientSession() as http:
        first, second = gateways
        url = "/v1/checkout"
        status, a = await _post(http, first + url, tokens[0], {"count": 60, "ttl_s": 600})
        assert status == 200 and len(a["proxies"]) == 60
        status, b = await _post(http, second + url, tokens[0], {"count": 40, "ttl_s": 600})
        assert status == 200 and len(b["proxies"]) == 40
        for gateway in gateways:
            status, over = await _post(http, gateway + url, tokens[0], {"count": 1, "ttl_s": 600})
            assert status == 429 and over["type"].endswith("checkout-cap"), over
            assert "holds 100 proxies" in over["detail"]
        one = a["proxies"][0]
        release = f"{first}/v1/checkout/{a['checkout']}/release"
        status, done = await _post(
            http, release, tokens[0], {"outcomes": {f"{one['ip']}:{one['port']}": "worked"}}
        )
        assert status == 200 and done["released"] == 60
        status, again = await _post(http, second + url, tokens[0], {"count": 1, "ttl_s": 600})
        assert status == 200 and len(again["proxies"]) == 1
