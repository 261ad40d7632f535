"""Walls an untested agent or a consumer could walk through, each tried as they would:
the real gateway on a port, the real log, tokens of the roles they hold."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

import events as ev
from events.mint import fresh_id, now_ms
from gateway.http import GatewayConfig
from gateway.leases import Granter
from ops.cli.admin import enroll
from ops.nats.client import Log
from projections.live import FoldService
from tests.fleet import serving

IPV6_PROXIES = ("2a00:1450:4001:80b::200e", "2606:4700:4700::1111", "2001:4860:4860::8888")


@contextlib.asynccontextmanager
async def _gateway(
    lg: Log, roles: dict[str, str], config: GatewayConfig | None = None
) -> AsyncIterator[tuple[Any, FoldService, dict[str, str]]]:
    """The real gateway over a fold caught up with the log; a token for each agent."""
    tokens = {name: await enroll(lg, name, role) for name, role in roles.items()}
    async with serving(lg, config) as (client, fold):
        yield client, fold, tokens


async def _post_events(client: Any, token: str, events: list[Any]) -> Any:
    body = {"events": [msgspec.to_builtins(e) for e in events]}
    return await client.post("/v1/events", json=body, headers={"Authorization": f"Bearer {token}"})


async def _configure(lg: Log, **settings: Any) -> None:
    configured = ev.Configured(
        id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(**settings)
    )
    await lg.publish(configured)


async def test_ipv6_proxies_from_an_untested_worker_do_not_stop_the_rechecks(
    log_client: Log,
) -> None:
    """Three IPv6 proxies reported by a worker, none located: a checker's recheck grant
    carries them (it answered 500 while ``network`` split their address on dots), and
    ``/v1/outages`` answers."""
    await _configure(log_client, recheck_fresh_s=0)
    roles = {"w-new": "worker", "c1": "checker"}
    async with _gateway(log_client, roles) as (client, fold, tokens):
        reports = [
            ev.ProxyWorked(
                id=fresh_id(),
                agent="w-new",
                at=now_ms(),
                ip=ip,
                port=3128,
                proto="http",
                latency_ms=90,
            )
            for ip in IPV6_PROXIES
        ]
        r = await _post_events(client, tokens["w-new"], reports)
        assert r.status == 200, await r.text()
        assert await fold.wait_for(await log_client.head_seq(), 5)
        assert {ip for ip, _ in fold.state.proxies} == set(IPV6_PROXIES)
        body = {"agent": "c1", "kind": "recheck", "count": 64, "ttl_s": 60}
        auth = {"Authorization": f"Bearer {tokens['c1']}"}
        r = await client.post("/v1/leases", json=body, headers=auth)
        assert r.status == 200, await r.text()
        handed = {p[0] for g in (await r.json())["leases"] for p in g["payload"]["proxies"]}
        assert handed == set(IPV6_PROXIES)
        r = await client.get("/v1/outages")
        assert r.status == 200, await r.text()


async def test_a_grant_that_fails_after_its_claims_gives_them_back(
    log_client: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever breaks while a grant's answer is built after its claims are stored: the
    agent gets a 500, and each claim is released ``abandoned``, uncounted, so its target
    is free for the next grant at once (it was held until the claim's TTL)."""
    await _configure(log_client, recheck_fresh_s=0)
    for i in range(3):
        await log_client.publish(
            ev.ProxyWorked(
                id=fresh_id(),
                agent="w-any",
                at=0,
                ip=f"45.61.{i}.1",
                port=80,
                proto="http",
                latency_ms=90,
            )
        )
    async with _gateway(log_client, {"c1": "checker"}) as (client, fold, tokens):
        auth = {"Authorization": f"Bearer {tokens['c1']}"}
        body = {"agent": "c1", "kind": "recheck", "count": 64, "ttl_s": 600}

        def broken(*_: Any) -> Any:
            raise RuntimeError("a bug while building the payload")

        with monkeypatch.context() as patch:
            patch.setattr(Granter, "_payload", broken)
            r = await client.post("/v1/leases", json=body, headers=auth)
        assert r.status == 500
        assert await fold.wait_for(await log_client.head_seq(), 5)
        shards = {ev.shard_of(f"45.61.{i}.1", 80) for i in range(3)}
        for shard in shards:
            row = fold.state.leases[shard]
            assert row.status == "free" and row.attempts == 0, row
        r = await client.post("/v1/leases", json=body, headers=auth)
        assert r.status == 200, await r.text()
        assert {g["target"] for g in (await r.json())["leases"]} == shards
