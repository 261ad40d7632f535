"""The gateway's agent and admin endpoints against a real nats-server on a real port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

import events as ev
from agents.gateway_client import GatewayClient
from eventlog.client import Log, fresh_id, now_ms
from gateway.app import make_app
from gateway.commands import GRANTER
from gateway.http import GatewayConfig
from gateway.natsauth import NatsAuth
from ops.cli import enroll
from ops.nats.server import NatsServer
from projections.live import FoldService
from tests.fleet import serving
from tests.helpers import worked

Client = TestClient  # type: ignore[type-arg]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def caught_up(fold: FoldService, lg: Log) -> None:
    assert await fold.wait_for(await lg.head_seq(), 10)


@pytest.fixture
async def gw(
    log_client: Log, nats_server: NatsServer
) -> AsyncIterator[tuple[Client, FoldService, dict[str, str]]]:
    tokens = {
        "admin": await enroll(log_client, "root", "admin"),
        "w1": await enroll(log_client, "w1", "worker"),
        "w2": await enroll(log_client, "w2", "worker"),
        "c1": await enroll(log_client, "c1", "checker"),
    }
    config = GatewayConfig(
        max_batch=50, rate_per_s=1000, burst=1000, agent_nats=nats_server.agent_auth()
    )
    async with serving(log_client, config) as (client, fold):
        yield client, fold, tokens


async def _json(resp: Any) -> Any:
    return await resp.json(content_type=None)


async def test_events_need_a_token_of_the_right_role(gw: Any, log_client: Log) -> None:
    """POST /v1/events needs a token whose role may publish those events."""
    client, _, tokens = gw
    raw = {"events": [msgspec.to_builtins(worked(agent="w1"))]}
    r = await client.post("/v1/events", json=raw)
    assert r.status == 401 and r.content_type == "application/problem+json"
    r = await client.post("/v1/events", json=raw, headers=auth("not-a-token"))
    assert r.status == 401
    head = await log_client.head_seq()
    r = await client.post("/v1/events", json=raw, headers=auth(tokens["w1"]))
    assert r.status == 200, await r.text()
    assert (await r.json())["seqs"] == [head + 1]
    # A worker may not publish as another agent, nor a checker's ProxyFailed.
    failed = ev.ProxyFailed(id=fresh_id(), agent="w1", at=0, ip="8.8.8.8", port=80, proto="http")
    bad = {"events": [msgspec.to_builtins(failed), raw["events"][0]]}
    bad["events"][1] = {**raw["events"][0], "agent": "w2", "id": fresh_id()}
    r = await client.post("/v1/events", json=bad, headers=auth(tokens["w1"]))
    problem = await _json(r)
    assert r.status == 400
    assert [(e["index"], e["field"]) for e in problem["errors"]] == [(0, "type"), (1, "agent")]
    assert await log_client.head_seq() == head + 1  # nothing of a bad batch is published


async def test_invalid_events_name_index_and_field(gw: Any, log_client: Log) -> None:
    """A 400 names the index and field of every invalid event; none is published."""
    client, _, tokens = gw
    good = msgspec.to_builtins(worked(agent="w1"))
    broken = {**good, "port": "eighty", "id": fresh_id()}
    missing = {k: v for k, v in good.items() if k != "ip"}
    unknown = {"type": "Teleported", "id": "x", "agent": "w1", "at": 0}
    head = await log_client.head_seq()
    r = await client.post(
        "/v1/events", json={"events": [good, broken, missing, unknown]}, headers=auth(tokens["w1"])
    )
    problem = await _json(r)
    assert r.status == 400 and problem["type"].endswith("/invalid-events")
    fields = {e["index"]: e["field"] for e in problem["errors"]}
    assert fields[1] == "port" and 2 in fields and 3 in fields and 0 not in fields
    assert await log_client.head_seq() == head
    r = await client.post("/v1/events", data=b"{nope", headers=auth(tokens["w1"]))
    assert r.status == 400
    r = await client.post("/v1/events", json={"events": [], "extra": 1}, headers=auth(tokens["w1"]))
    assert r.status == 400
    many = {"events": [{**good, "id": fresh_id()} for _ in range(51)]}
    r = await client.post("/v1/events", json=many, headers=auth(tokens["w1"]))
    assert r.status == 413


async def test_same_event_twice_is_one_observation(gw: Any, log_client: Log) -> None:
    """The same event id posted twice is stored once."""
    client, fold, tokens = gw
    event = msgspec.to_builtins(worked("9.9.9.9", agent="w1"))
    for _ in range(2):
        r = await client.post("/v1/events", json={"events": [event]}, headers=auth(tokens["w1"]))
        assert r.status == 200
    await caught_up(fold, log_client)
    assert fold.state.proxies[("9.9.9.9", 8080)].confirmations == 1


async def _served(client: Client, query: str = "") -> dict[str, str]:
    """ip -> status of what GET /v1/proxies serves (the snapshot may be a second old)."""
    body = await _json(await client.get("/v1/proxies?limit=0" + query))
    return {p["ip"]: p["status"] for p in body["proxies"]}


async def _until(client: Client, query: str, want: dict[str, str]) -> dict[str, str]:
    deadline = asyncio.get_running_loop().time() + 5
    while (got := await _served(client, query)) != want:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)
    return got


async def test_a_proxy_whose_latest_check_failed_is_not_served_until_it_works(gw: Any) -> None:
    """Over HTTP: a checker's failed check takes the proxy out of GET /v1/proxies (it is
    listed by ?status=suspect, with that status), and its next success brings it back."""
    client, _, tokens = gw
    for ip in ("9.9.9.9", "8.8.4.4"):
        event = msgspec.to_builtins(worked(ip, agent="w1"))
        r = await client.post("/v1/events", json={"events": [event]}, headers=auth(tokens["w1"]))
        assert r.status == 200
    both = {"9.9.9.9": "alive", "8.8.4.4": "alive"}
    assert await _until(client, "", both) == both
    failed = ev.ProxyFailed(
        id=fresh_id(), agent="c1", at=0, ip="9.9.9.9", port=8080, proto="http", error="timeout"
    )
    r = await client.post(
        "/v1/events", json={"events": [msgspec.to_builtins(failed)]}, headers=auth(tokens["c1"])
    )
    assert r.status == 200
    assert await _until(client, "", {"8.8.4.4": "alive"}) == {"8.8.4.4": "alive"}
    assert await _served(client, "&status=suspect") == {"9.9.9.9": "suspect"}
    back = msgspec.to_builtins(worked("9.9.9.9", agent="c1"))
    r = await client.post("/v1/events", json={"events": [back]}, headers=auth(tokens["c1"]))
    assert r.status == 200
    assert await _until(client, "", both) == both
    assert await _served(client, "&status=suspect") == {}


async def test_a_consumer_reads_and_reports_and_nothing_else(gw: Any, log_client: Log) -> None:
    """A consumer token: its failed report takes a proxy out of GET /v1/proxies at once,
    its worked report revives nothing, its budget is answered with 429 past the end, and
    it may publish no event and lease nothing."""
    client, fold, tokens = gw
    shop = await enroll(log_client, "shop", "consumer")
    settings = ev.Settings(report_budget_per_hour=1)
    await log_client.publish(ev.Configured(id=fresh_id(), agent="admin", at=0, settings=settings))
    for ip in ("9.9.9.9", "8.8.4.4"):
        event = msgspec.to_builtins(worked(ip, agent="w1"))
        r = await client.post("/v1/events", json={"events": [event]}, headers=auth(tokens["w1"]))
        assert r.status == 200
    await caught_up(fold, log_client)
    both = {"9.9.9.9": "alive", "8.8.4.4": "alive"}
    assert await _until(client, "", both) == both

    report = "/v1/proxies/9.9.9.9:8080/report"
    r = await client.post(report, json={"outcome": "failed"}, headers=auth(tokens["w1"]))
    assert r.status == 403  # a worker is not a consumer
    r = await client.post(
        report, json={"outcome": "failed", "detail": "timeout"}, headers=auth(shop)
    )
    body = await _json(r)
    assert r.status == 200, body
    assert (body["status"], body["budget_left"]) == ("suspect", 0)
    assert await _until(client, "", {"8.8.4.4": "alive"}) == {"8.8.4.4": "alive"}
    r = await client.post(report, json={"outcome": "worked"}, headers=auth(shop))
    assert r.status == 200 and (await _json(r))["status"] == "suspect"  # revives nothing
    other = "/v1/proxies/8.8.4.4:8080/report"
    r = await client.post(other, json={"outcome": "failed"}, headers=auth(shop))
    assert r.status == 429 and r.headers["Retry-After"].isdigit()
    assert await _served(client) == {"8.8.4.4": "alive"}

    for path, payload, status in (
        ("/v1/proxies/1.2.3.4:8080/report", {"outcome": "failed"}, 404),
        (report, {"outcome": "gone"}, 400),
        (report, {"outcome": "failed", "detail": "\u202e"}, 400),
        ("/v1/proxies/9.9.9.9/report", {"outcome": "failed"}, 400),
    ):
        r = await client.post(path, json=payload, headers=auth(shop))
        assert r.status == status, (path, payload, await r.text())
    raw = {"events": [msgspec.to_builtins(worked("7.7.7.7", agent="shop"))]}
    # It may post its traffic's rounds (ProxiesChecked), and nothing else.
    r = await client.post("/v1/events", json=raw, headers=auth(shop))
    assert r.status == 400 and "may not publish" in (await r.json())["errors"][0]["reason"]
    lease = {"agent": "shop", "kind": "recheck"}
    assert (await client.post("/v1/leases", json=lease, headers=auth(shop))).status == 403
    # Who it is (the rotating endpoint checks its logins so), and no NATS login.
    me = await (await client.get("/v1/agents/me", headers=auth(shop))).json()
    assert (me["role"], me["nats"]) == ("consumer", None)


async def test_leases_are_granted_once_extended_and_released(gw: Any, log_client: Log) -> None:
    """A lease is granted once, extended by heartbeats, and freed by its release."""
    client, fold, tokens = gw
    urls = [f"http://lists.example/{i}.txt" for i in range(3)]
    r = await client.post(
        "/v1/sources", json={"urls": urls, "proto_hint": "socks5"}, headers=auth(tokens["w1"])
    )
    assert r.status == 403
    r = await client.post(
        "/v1/sources", json={"urls": urls, "proto_hint": "socks5"}, headers=auth(tokens["admin"])
    )
    assert r.status == 200 and len((await r.json())["added"]) == 3
    await caught_up(fold, log_client)

    async def lease(who: str, count: int) -> list[dict[str, Any]]:
        r = await client.post(
            "/v1/leases",
            json={"agent": who, "kind": "source", "count": count, "ttl_s": 60},
            headers=auth(tokens[who]),
        )
        assert r.status == 200, await r.text()
        return (await r.json())["leases"]  # type: ignore[no-any-return]

    first, second = await asyncio.gather(lease("w1", 2), lease("w2", 2))
    targets = [g["target"] for g in first + second]
    assert len(targets) == len(set(targets)) == 3  # every source once, to one agent
    grant = first[0]
    assert grant["payload"]["url"] in urls and grant["payload"]["proto_hint"] == "socks5"
    assert grant["epoch"] > 0 and grant["expires_at"] > now_ms()
    assert await lease("w1", 5) == []  # nothing left to lease

    r = await client.post(f"/v1/leases/{grant['lease']}/heartbeat", headers=auth(tokens["w2"]))
    assert r.status == 409  # not w2's lease
    r = await client.post(f"/v1/leases/{grant['lease']}/heartbeat", headers=auth(tokens["w1"]))
    assert r.status == 200 and (await r.json())["expires_at"] >= grant["expires_at"]
    r = await client.post(
        f"/v1/leases/{grant['lease']}/release", json={"outcome": "done"}, headers=auth(tokens["w1"])
    )
    assert r.status == 200  # once in the log, not once folded: wait for the fold
    assert await fold.wait_for((await r.json())["seq"], 10)
    r = await client.post(
        f"/v1/leases/{grant['lease']}/release", json={"outcome": "done"}, headers=auth(tokens["w1"])
    )
    assert r.status == 409 and (await r.json())["type"].endswith("/lease-lost")
    again = await lease("w2", 1)
    assert [g["target"] for g in again] == [grant["target"]]
    r = await client.post(
        "/v1/leases", json={"agent": "c1", "kind": "source", "count": 1}, headers=auth(tokens["c1"])
    )
    assert r.status == 403  # a checker leases recheck shards only
    r = await client.post(
        "/v1/leases",
        json={"agent": "c1", "kind": "recheck", "count": 3},
        headers=auth(tokens["c1"]),
    )
    assert r.status == 200
    assert (await r.json())["leases"] == []  # no proxy is due: no shard is work


async def test_two_gateways_never_grant_one_target_twice(log_client: Log) -> None:
    """Two gateways on one log never grant one target twice."""
    tokens = {f"w{i}": await enroll(log_client, f"w{i}", "worker") for i in range(6)}
    for i in range(20):
        url = f"http://race.example/{i}"
        await log_client.publish(
            ev.SourceAdded(
                id=fresh_id(), agent="admin", at=now_ms(), url=url, url_id=ev.url_id(url)
            )
        )
    folds = [FoldService(log_client, db=None) for _ in range(2)]
    clients = []
    for fold in folds:
        await fold.start()
        await caught_up(fold, log_client)
        client = TestClient(TestServer(make_app(fold, log_client)))
        await client.start_server()
        clients.append(client)
    try:

        async def claim(i: int) -> list[str]:
            client = clients[i % 2]
            who = f"w{i % 6}"
            r = await client.post(
                "/v1/leases",
                json={"agent": who, "kind": "source", "count": 4},
                headers=auth(tokens[who]),
            )
            assert r.status == 200
            return [g["target"] for g in (await r.json())["leases"]]

        results = await asyncio.gather(*(claim(i) for i in range(12)))
        granted = [t for r in results for t in r]
        assert len(granted) == len(set(granted)) == 20
    finally:
        for client in clients:
            await client.close()
        for fold in folds:
            await fold.stop()


async def test_judge_echoes_an_agents_check_and_nobody_else(gw: Any) -> None:
    """/judge on the API listener: a stranger gets 403 and nothing echoed (an injected
    header least of all); an enrolled agent's nonce, with the key GET /v1/agents/me gave
    it, gets the caller's address and headers."""
    from events.wire import judge_nonce

    client, _, tokens = gw
    token = tokens["w1"]
    injected = {"X-Forwarded-For": "1.2.3.4", "Via": "1.1 squid"}
    stranger = await client.get("/judge?n=anything", headers=injected)
    assert stranger.status == 403 and "1.2.3.4" not in await stranger.text()
    me = await (await client.get("/v1/agents/me", headers=auth(token))).json()
    here = f"{client.host}:{client.port}"
    nonce = judge_nonce(
        me["name"], bytes.fromhex(me["judge_key"]), here, int(time.time()) + 60, "r1"
    )
    r = await client.get(f"/judge?n={nonce}", headers={**injected, "Host": here})
    assert r.status == 200
    body = await r.json()
    assert body["remote"] == "127.0.0.1"
    headers = {k.lower(): v for k, v in body["headers"]}
    assert headers["x-forwarded-for"] == "1.2.3.4" and headers["via"] == "1.1 squid"


async def test_rate_limit_answers_429(log_client: Log) -> None:
    """A token over its rate gets 429 with Retry-After."""
    token = await enroll(log_client, "w1", "worker")
    async with serving(log_client, GatewayConfig(rate_per_s=1, burst=3)) as (client, _):
        codes = []
        for _ in range(5):
            r = await client.post("/v1/events", json={"events": []}, headers=auth(token))
            codes.append(r.status)
        assert codes[:3] == [200, 200, 200] and codes[-1] == 429
        assert "Retry-After" in r.headers


async def test_private_queries_need_a_token(log_client: Log) -> None:
    """With private queries, reads need a token."""
    token = await enroll(log_client, "w1", "worker")
    async with serving(log_client, GatewayConfig(private_queries=True)) as (client, _):
        assert (await client.get("/v1/proxies")).status == 401
        assert (await client.get("/v1/proxies", headers=auth(token))).status == 200
        assert (await client.get("/healthz")).status == 200


async def test_openapi_is_served_and_committed(gw: Any) -> None:
    """/openapi.json is served and equals the committed document."""
    import json
    from pathlib import Path

    client, _, _ = gw
    served = await (await client.get("/openapi.json")).json()
    committed = json.loads((Path(__file__).parent.parent / "schemas" / "openapi.json").read_text())
    assert served == committed
    assert "/v1/leases" in served["paths"] and "LeaseRequest" in served["components"]["schemas"]


async def test_requests_and_refusals_are_logged_with_the_agent(gw: Any) -> None:
    """One line per request; refusals at info with the caller bound (structlog)."""
    from structlog.contextvars import merge_contextvars
    from structlog.testing import capture_logs

    client, _, tokens = gw
    with capture_logs(processors=[merge_contextvars]) as logs:
        r = await client.post("/v1/sources", json={"urls": []}, headers=auth(tokens["w1"]))
        assert r.status == 403
        assert (await client.get("/healthz")).status == 200
    lines = [x for x in logs if x["event"] == "request_answered"]
    refused = next(x for x in lines if x["path"] == "/v1/sources")
    assert refused["status"] == 403 and refused["agent"] == "w1"
    assert refused["log_level"] == "info"
    healthy = next(x for x in lines if x["path"] == "/healthz")
    assert healthy["log_level"] == "debug" and "agent" not in healthy


async def test_agents_are_offered_their_own_nats_login(log_client: Log) -> None:
    """/v1/agents/me names the URL an agent publishes through: its own login (minted
    from its token), at the address the agent reached the gateway by when the server
    listens everywhere; people get none (they have the service's)."""
    tokens = {r: await enroll(log_client, f"{r}1", r) for r in ("worker", "checker", "admin")}
    config = GatewayConfig(agent_nats=NatsAuth(address="nats://0.0.0.0:4222"))
    async with serving(log_client, config) as (client, fold):
        worker = await _json(await client.get("/v1/agents/me", headers=auth(tokens["worker"])))
        key = worker.pop("judge_key")  # its key for this gateway's judge (gateway/judge.py)
        assert len(bytes.fromhex(key)) == 32
        assert worker == {"name": "worker1", "role": "worker", "nats": "nats://127.0.0.1:4222"}
        admin = await _json(await client.get("/v1/agents/me", headers=auth(tokens["admin"])))
        assert admin["nats"] is None
    # With the callout's key, the login is minted (tests/test_agent_identity.py uses it).
    offer = NatsAuth(address="nats://0.0.0.0:4222", issuer_seed=b"key")
    digest = fold.state.agents["worker1"].token_sha256
    minted = offer.url_for("worker1", digest)
    assert minted.startswith("nats://worker1:n") and minted.endswith("@0.0.0.0:4222")
    assert minted == offer.url_for("worker1", digest)  # every gateway with the key agrees
    assert minted != offer.url_for("worker1", "0" * 64)  # a new token: a new password
    assert minted != offer.url_for("checker1", digest)


async def test_agent_outbox_sets_aside_what_the_log_will_never_take(
    gw: Any, log_client: Log, nats_server: Any, tmp_path: Path
) -> None:
    """An invalid event, or a damaged outbox line, is kept aside with its reason instead
    of blocking every observation after it; batches shrink to what the gateway takes."""
    client, _, tokens = gw
    base = str(client.make_url("")).rstrip("/")
    good = [worked(agent="w1", ip=f"8.8.{i // 250}.{i % 250 + 1}") for i in range(120)]
    broken = msgspec.structs.replace(worked(agent="w1"), port="eighty")  # type: ignore[arg-type]
    head = await log_client.head_seq()
    outbox = tmp_path / "http" / "outbox.jsonl"
    async with GatewayClient(base, tokens["w1"], "w1", outbox, http_only=True) as agent:
        assert await agent.publish([*good[:60], broken, *good[60:]])  # batches of 50 at most
    assert await log_client.head_seq() == head + 120
    [aside] = outbox.with_suffix(".rejected").read_bytes().splitlines()
    assert aside.startswith(b"port:") and b'"eighty"' in aside
    assert not outbox.exists()

    outbox = tmp_path / "by-nats" / "outbox.jsonl"
    outbox.parent.mkdir()
    fresh = worked(agent="w1", id=fresh_id())  # an outbox keeps an hour's events, no more
    outbox.write_bytes(b'{"type": "Fetched", "id": \n' + ev.encode(fresh) + b"\n")
    async with GatewayClient(base, tokens["w1"], "w1", outbox) as agent:
        assert agent.via == "nats" and await agent.flush()
    assert await log_client.head_seq() == head + 121
    assert outbox.with_suffix(".rejected").read_bytes().startswith(b"undecodable\t")


async def test_a_source_fetched_since_the_ranking_is_not_leased_again(
    gw: Any, log_client: Log
) -> None:
    """The granter keeps its ranking of due sources a moment; a source fetched and
    released in that moment is not due any more, and is not granted from the ranking."""
    client, fold, tokens = gw
    client.app[GRANTER].ranking.due_refresh_s = 3600.0  # the ranking outlives this whole test
    url = "http://lists.example/once.txt"
    r = await client.post("/v1/sources", json={"urls": [url]}, headers=auth(tokens["admin"]))
    assert r.status == 200
    await caught_up(fold, log_client)
    body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60}
    [grant] = (await _json(await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))))[
        "leases"
    ]
    fetched = ev.Fetched(
        id=fresh_id(),
        agent="w1",
        at=now_ms(),
        url_id=grant["target"],
        lease=grant["lease"],
        ok=True,
        http_status=200,
        content_hash="ab" * 32,
        changed=True,
    )
    events = {"events": [msgspec.to_builtins(fetched)]}
    assert (await client.post("/v1/events", json=events, headers=auth(tokens["w1"]))).status == 200
    release = {"outcome": "done"}
    r = await client.post(
        f"/v1/leases/{grant['lease']}/release", json=release, headers=auth(tokens["w1"])
    )
    assert r.status == 200
    again = await _json(await client.post("/v1/leases", json=body, headers=auth(tokens["w1"])))
    assert again["leases"] == []


async def test_the_ranking_stays_fresh_while_a_look_ahead_round_waits(
    gw: Any, log_client: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sources' ranking is kept fresh in the background even while a round of the
    look-ahead waits on the server (here, for good): a grant does not rank the sources
    itself on the request's time."""
    client, fold, tokens = gw
    granter = client.app[GRANTER]
    granter.ranking.due_refresh_s = 0.2
    looked = asyncio.Event()

    async def stuck(*_args: Any) -> None:
        looked.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr("gateway.leases.far_behind", lambda _fold: asyncio.sleep(0, True))
    monkeypatch.setattr(granter.lookahead, "look_up", stuck)
    await caught_up(fold, log_client)
    body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60}
    assert (await client.post("/v1/leases", json=body, headers=auth(tokens["w1"]))).status == 200
    await asyncio.wait_for(looked.wait(), 5)
    ranked = []
    for _ in range(10):
        await asyncio.sleep(0.25)
        ranked.append(granter.ranking.age())
    assert max(ranked) <= 2 * granter.ranking.due_refresh_s, ranked
