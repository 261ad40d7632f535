"""Sure claims: a lease on a free target is answered once stored, before the fold has
applied it (gateway/leases.py), and what the agent does next with it still works."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventlog.client import Log, now_ms
from gateway.http import GatewayConfig
from ops.cli import enroll
from projections.live import FoldService
from tests.fleet import serving


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def caught_up(fold: FoldService, lg: Log) -> None:
    assert await fold.wait_for(await lg.head_seq(), 10)


@pytest.fixture
async def gw(log_client: Log) -> AsyncIterator[tuple[Any, FoldService, dict[str, str]]]:
    tokens = {
        "admin": await enroll(log_client, "root", "admin"),
        "w1": await enroll(log_client, "w1", "worker"),
    }
    async with serving(log_client, GatewayConfig(rate_per_s=1000, burst=1000)) as (client, fold):
        yield client, fold, tokens


async def test_a_lease_on_a_free_target_is_granted_without_waiting_for_the_fold(
    gw: Any, log_client: Log
) -> None:
    """While the fold is held back (a backlog), a claim on a free target that the
    compare-and-set stored is answered at once: the ledger grants it when folded, to the
    same lease and epoch, and never expiring earlier than the answer said; a second
    request meanwhile is not handed the same target."""
    client, fold, tokens = gw
    urls = [f"http://lists.example/ahead-{i}.txt" for i in range(2)]
    r = await client.post("/v1/sources", json={"urls": urls}, headers=auth(tokens["admin"]))
    assert r.status == 200
    await caught_up(fold, log_client)
    body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60}
    async with fold._cut:  # the fold applies nothing while this is held
        t = time.monotonic()
        r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
        answered = time.monotonic() - t
        assert r.status == 200
        (grant,) = (await r.json())["leases"]
        r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
        (other,) = (await r.json())["leases"]
        assert fold.applied_seq < grant["epoch"]  # answered before the fold saw it
    assert answered < 1.0  # the fold's wait is 2 s: it did not wait for it
    assert other["target"] != grant["target"]
    await caught_up(fold, log_client)
    row = fold.state.leases[grant["target"]]
    assert (row.status, row.lease, row.epoch) == ("leased", grant["lease"], grant["epoch"])
    assert row.expires_at >= grant["expires_at"] > now_ms()


async def test_a_lease_released_at_once_after_its_grant_is_released(
    gw: Any, log_client: Log
) -> None:
    """A worker with nothing to do releases the lease it was just granted, before the
    fold has applied the grant: the gateway waits for the log's head as it is now (its
    cached head, read every 250 ms, predates the grant) and releases it; no 409."""
    client, fold, tokens = gw
    url = "http://lists.example/at-once.txt"
    r = await client.post("/v1/sources", json={"urls": [url]}, headers=auth(tokens["admin"]))
    assert r.status == 200
    await caught_up(fold, log_client)
    await asyncio.sleep(0.3)  # the cached head is this head: the grant comes after it
    body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60}
    await fold._cut.acquire()  # the fold applies nothing while this is held
    try:
        r = await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))
        (grant,) = (await r.json())["leases"]
        assert fold.applied_seq < grant["epoch"]
        asyncio.get_running_loop().call_later(0.3, fold._cut.release)  # the fold goes on
        r = await client.post(
            f"/v1/leases/{grant['lease']}/release",
            json={"outcome": "done"},
            headers=auth(tokens["w1"]),
        )
    finally:
        await asyncio.sleep(0.4)
        assert not fold._cut.locked()
    assert r.status == 200, await r.text()
    await caught_up(fold, log_client)
    assert fold.state.leases[grant["target"]].status != "leased"
