"""Identity bound to the publisher (issue 11, item 1), attacked with an agent's own NATS
credentials: what a worker says as someone else, or as the service, never reaches a
projection; a revoked agent is cut off, live connection included."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
import nats
import nats.errors
import pytest
from aiohttp.test_utils import TestClient

import events as ev
from agents.gateway_client import GatewayClient
from eventlog.client import Log
from events.mint import enrollment, fresh_id, now_ms
from gateway.http import GatewayConfig
from ops.cli.admin import enroll
from ops.nats.server import NatsServer
from projections.live import FoldService
from tests.fleet import serving
from tests.helpers import dlq_messages, worked


def _configured(**settings: Any) -> ev.Configured:
    return ev.Configured(
        id=fresh_id(), agent="admin", at=now_ms(), settings=ev.Settings(**settings)
    )


@contextlib.asynccontextmanager
async def _fleet(
    lg: Log, server: NatsServer
) -> AsyncIterator[tuple[TestClient, FoldService, dict[str, str]]]:
    """The scheme switched on, two workers and a checker enrolled, and a gateway that
    decides NATS logins for the embedded server."""
    await lg.publish(_configured(agent_subjects=True))
    tokens = {
        "w1": await enroll(lg, "w1", "worker"),
        "w2": await enroll(lg, "w2", "worker"),
        "c1": await enroll(lg, "c1", "checker"),
        "root": await enroll(lg, "root", "admin"),
    }
    async with serving(lg, GatewayConfig(agent_nats=server.agent_auth())) as (client, fold):
        yield client, fold, tokens


@pytest.fixture
async def fleet(
    log_client: Log, nats_server: NatsServer
) -> AsyncIterator[tuple[TestClient, FoldService, dict[str, str]]]:
    async with _fleet(log_client, nats_server) as parts:
        yield parts


async def _me(client: TestClient, token: str) -> dict[str, Any]:
    r = await client.get("/v1/agents/me", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200
    body: dict[str, Any] = await r.json()
    return body


class Agent:
    """A NATS connection with an agent's own credentials, and what the server told it."""

    def __init__(self, nc: nats.NATS, errors: list[str], disconnects: list[int]) -> None:
        self.nc = nc
        self.errors = errors
        self.disconnects = disconnects
        self.js = nc.jetstream(timeout=2)

    @classmethod
    async def connect(cls, url: str, name: str) -> Agent:
        errors: list[str] = []
        disconnects: list[int] = []

        async def error_cb(exc: Exception) -> None:
            errors.append(str(exc))

        async def disconnected_cb() -> None:
            disconnects.append(1)

        nc = await nats.connect(
            url,
            inbox_prefix=ev.agent_inbox(name),
            error_cb=error_cb,
            disconnected_cb=disconnected_cb,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
        )
        return cls(nc, errors, disconnects)

    async def publish(self, subject: str, event: ev.Event) -> int:
        ack = await self.js.publish(
            subject, ev.encode(event), headers={"Nats-Msg-Id": ev.agent_msg_id(event)}
        )
        return int(ack.seq)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()


async def _refused_login(url: str) -> str:
    """What the server answers a login, spoken in the protocol itself: a refused nats-py
    client leaves its socket to the garbage collector, which then warns in a later test."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        assert (await reader.readline()).startswith(b"INFO")
        connect = {
            "user": unquote(parts.username or ""),
            "pass": unquote(parts.password or ""),
            "verbose": False,
            "protocol": 1,
        }
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 5)).decode()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_each_agent_gets_its_own_login_and_only_its_own_subjects(
    fleet: Any, log_client: Log
) -> None:
    """w1's minted login publishes on ppf.in.w1.> only: the service's entity subjects,
    another agent's subjects and the config subject are refused by the server itself,
    and nothing refused is stored."""
    client, fold, tokens = fleet
    me = await _me(client, tokens["w1"])
    assert me["nats"].startswith("nats://w1:n") and tokens["w1"] not in me["nats"]
    w1 = await Agent.connect(me["nats"], "w1")
    try:
        good = worked(agent="w1", ip="8.8.4.4")
        seq = await w1.publish(ev.agent_subject(good), good)
        assert await fold.wait_for(seq, 5)
        assert ("8.8.4.4", good.port) in fold.state.proxies
        head = await log_client.head_seq()
        forged = worked(agent="w1", ip="9.9.9.9")
        for subject in (
            ev.subject_for(forged),  # the service's entity subject
            "ppf.in.w2.proxy.9-9-9-9_8080",  # another agent's
            "ppf.config",
            "ppf.agent.mallory",
            "ppf.lease.source.0123456789abcdef",
        ):
            with pytest.raises(nats.errors.TimeoutError):  # dropped: no ack
                await w1.publish(subject, forged)
        await w1.nc.flush()
        assert await log_client.head_seq() == head
        violations = [e for e in w1.errors if "permissions violation for publish" in e.lower()]
        assert len(violations) == 5, w1.errors
    finally:
        await w1.close()


async def test_agents_read_only_their_own_inbox(fleet: Any) -> None:
    """No reading of the log, of the service's replies or of another agent's acks."""
    client, _, tokens = fleet
    w1 = await Agent.connect((await _me(client, tokens["w1"]))["nats"], "w1")
    try:
        for subject in ("ppf.>", "_INBOX.>", "$JS.API.>", "_INBOX_AGENT.>", "_INBOX_AGENT.w2.>"):
            await w1.nc.subscribe(subject)
        await w1.nc.flush()
        await asyncio.sleep(0.3)
        for subject in ("ppf.>", "_INBOX.>", "$JS.API.>", "_INBOX_AGENT.>", "_INBOX_AGENT.w2.>"):
            said = f'permissions violation for subscription to "{subject.lower()}"'
            assert any(said in e.lower() for e in w1.errors), (subject, w1.errors)
        with pytest.raises(nats.errors.Error):
            await w1.js.stream_info("PPF")
    finally:
        await w1.close()


async def test_forgeries_on_an_agents_own_subjects_reach_only_the_dlq(
    fleet: Any, log_client: Log
) -> None:
    """Everything issue 11 saw a worker do with its NATS user, now on the one subject
    tree it may write: each is stored (the server cannot read payloads) and each is
    refused by the fold as ``forbidden``, with no effect on tokens, settings, leases or
    the pool."""
    client, fold, tokens = fleet
    w1 = await Agent.connect((await _me(client, tokens["w1"]))["nats"], "w1")
    _, enrolled = enrollment("mallory", "admin", by="w1")
    _, stolen = enrollment("w2", "worker", by="w1")
    forgeries: list[tuple[str, ev.Event]] = [
        ("ppf.in.w1.agent.mallory", enrolled),
        ("ppf.in.w1.agent.w2", stolen),
        ("ppf.in.w1.config", _configured(lab=True, proxy_ttl_s=999_999_999)),
        # another agent's name in the event: the report would count as c1's
        ("ppf.in.w1.proxy.1-1-1-1_80", worked(agent="c1", ip="1.1.1.1", port=80)),
        # a checker's event type from a worker
        (
            "ppf.in.w1.proxy.1-1-1-1_80",
            ev.ProxyFailed(
                id=fresh_id(), agent="w1", at=now_ms(), ip="1.1.1.1", port=80, proto="http"
            ),
        ),
        # the right agent and type, the wrong key: it would land in another partition
        ("ppf.in.w1.proxy.2-2-2-2_80", worked(agent="w1", ip="1.1.1.1", port=80)),
        (
            "ppf.in.w1.lease.source.0123456789abcdef",
            ev.Released(
                id=fresh_id(),
                agent="w1",
                at=now_ms(),
                lease="x",
                target="0123456789abcdef",
                outcome="done",
            ),
        ),
    ]
    before = (dict(fold.state.tokens), fold.state.settings, len(fold.state.proxies))
    try:
        seqs = [await w1.publish(subject, event) for subject, event in forgeries]
    finally:
        await w1.close()
    assert await fold.wait_for(seqs[-1], 5)
    assert (dict(fold.state.tokens), fold.state.settings, len(fold.state.proxies)) == before
    assert "mallory" not in fold.state.agents
    assert not fold.state.leases
    # Each refusal is kept in the DLQ under `forbidden`, with its reason.
    deadline = asyncio.get_running_loop().time() + 5
    while fold.dead_letters.sent < len(forgeries) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert fold.dead_letters.sent == len(forgeries)
    entries = {}
    for msg in await dlq_messages(log_client):
        if msg.subject == "ppf.dlq.forbidden" and msg.headers:
            entries[int(msg.headers["Ppf-Seq"])] = msg.headers["Ppf-Error"]
    assert sorted(entries) == seqs
    said = [entries[s] for s in seqs]
    assert "published by 'w1'" in said[3] and "role worker may not publish ProxyFailed" in said[4]
    assert "belongs on ppf.in.w1.proxy.1-1-1-1_80" in said[5]
    # The real w2 still works over HTTP: its token was not replaced.
    assert (await _me(client, tokens["w2"]))["name"] == "w2"


async def test_wrong_or_borrowed_passwords_are_refused(fleet: Any, nats_server: NatsServer) -> None:
    """A login is the agent's name with the password minted for it: another agent's
    password, an admin's name, an unknown name and a guessed password all fail."""
    client, _, tokens = fleet
    w1_url = (await _me(client, tokens["w1"]))["nats"]
    password = w1_url.split(":")[2].split("@")[0]
    hostport = nats_server.address.removeprefix("nats://")
    for user, pw in (("w2", password), ("root", password), ("nobody", password), ("w1", "x")):
        said = await _refused_login(f"nats://{user}:{pw}@{hostport}")
        assert "authorization" in said.lower(), said
    assert (await _me(client, tokens["w1"]))["nats"] == w1_url  # minted the same each time


async def test_revoking_a_token_cuts_the_agent_off(
    fleet: Any, log_client: Log, nats_server: NatsServer
) -> None:
    """`ppf token revoke`'s event: the HTTP token stops working, the live NATS connection
    is cut, and the reconnect with the old password is refused; a fresh token mints a
    new login that works."""
    client, fold, tokens = fleet
    url = (await _me(client, tokens["w2"]))["nats"]
    # No reconnects by nats-py: its refused sockets warn in later tests; the refusal of
    # the old login is asked in the protocol itself below.
    w2 = await Agent.connect(url, "w2")
    try:
        revoke = ev.AgentEnrolled(
            id=fresh_id(), agent="admin", at=now_ms(), name="w2", role="worker", token_sha256=""
        )
        seq = (await log_client.publish(revoke)).seq
        assert await fold.wait_for(seq, 5)
        r = await client.get("/v1/agents/me", headers={"Authorization": f"Bearer {tokens['w2']}"})
        assert r.status == 401
        deadline = asyncio.get_running_loop().time() + 10
        # Until its disconnect is heard (the callback may come after the close is seen).
        while not w2.disconnects and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert w2.disconnects, "the live connection was not cut"
        assert "authorization" in (await _refused_login(url)).lower()
        assert fold.state.agents["w2"].role == "worker"  # kept, for the record
    finally:
        await w2.close()
    fresh = await enroll(log_client, "w2", "worker")
    assert await fold.wait_for(await log_client.head_seq(), 5)
    new_url = (await _me(client, fresh))["nats"]
    assert new_url != url
    again = await Agent.connect(new_url, "w2")
    try:
        event = worked(agent="w2", ip="8.8.8.8")
        assert await again.publish(ev.agent_subject(event), event) > 0
    finally:
        await again.close()


async def test_the_system_login_is_the_gateways_alone(fleet: Any, nats_server: NatsServer) -> None:
    """The system account (the gateway's kicks) opens only to the sys password."""
    hostport = nats_server.address.removeprefix("nats://")
    said = await _refused_login(f"nats://sys:guess@{hostport}")
    assert "authorization" in said.lower()
    good = nats_server.agent_auth().sys_password
    nc = await nats.connect(f"nats://sys:{good}@{hostport}", allow_reconnect=False)
    try:
        reply = await nc.request("$SYS.REQ.SERVER.PING", b"", timeout=2)
        assert json.loads(reply.data)["server"]["id"]
    finally:
        await nc.close()


async def test_concurrent_sends_of_one_agent_lose_nothing_to_its_mark(
    fleet: Any, tmp_path: Path
) -> None:
    """The fold ignores an agent's observation whose id is at or below its mark (a
    re-send), so the agent's client numbers events as it sends them: two batches sent
    at once, made in the opposite order (older ids in the later send), all arrive."""
    client, fold, tokens = fleet
    base = str(client.make_url("")).rstrip("/")
    older = [worked(agent="w1", ip=f"8.8.1.{i}") for i in range(1, 51)]
    newer = [worked(agent="w1", ip=f"8.8.2.{i}") for i in range(1, 51)]
    async with GatewayClient(base, tokens["w1"], "w1", tmp_path / "outbox.jsonl") as agent:
        sent = await asyncio.gather(agent.publish(newer), agent.publish(older))
        assert agent.via == "nats" and all(sent)
    assert await fold.wait_for(await fold.head_seq(), 5)
    for e in [*older, *newer]:
        assert (e.ip, e.port) in fold.state.proxies, e.ip


def _nonsense(agent: str) -> list[ev.Event]:
    """What issue 11 saw served: fiction in every field a worker fills."""
    base = {"agent": agent, "at": now_ms()}
    return [
        worked(agent=agent, ip="8.8.8.1", proto="../\u202e<x>"),
        worked(agent=agent, ip="8.8.8.2", latency_ms=-5),
        worked(agent=agent, ip="8.8.8.3", exit_ip="<script>"),
        ev.Discovered(
            id=fresh_id(), parent="0123456789abcdef", urls=["file:///etc/passwd"], **base
        ),
        ev.Discovered(
            id=fresh_id(), parent="0123456789abcdef", urls=["gopher://x.example/"], **base
        ),
        ev.Discovered(
            id=fresh_id(),
            parent="0123456789abcdef",
            urls=["http://169.254.169.254/latest/meta-data/"],
            **base,
        ),
        ev.Discovered(
            id=fresh_id(),
            parent="0123456789abcdef",
            urls=[f"http://l{i}.example/" for i in range(100)],
            **base,
        ),
    ]


async def test_nonsense_facts_are_refused_over_nats_and_over_http(
    fleet: Any, log_client: Log
) -> None:
    """The same validation at both doors: over HTTP a 400 naming the field, nothing
    published; over NATS (where the server cannot read payloads) stored, then refused by
    the fold as `invalid` with the same reason, nothing applied."""
    client, fold, tokens = fleet
    bad = _nonsense("w1")
    for event in bad:
        r = await client.post(
            "/v1/events",
            json={"events": [msgspec.to_builtins(event)]},
            headers={"Authorization": f"Bearer {tokens['w1']}"},
        )
        assert r.status == 400, event
        [error] = (await r.json())["errors"]
        assert error["field"] in ("proto", "latency_ms", "exit_ip", "urls"), error
    w1 = await Agent.connect((await _me(client, tokens["w1"]))["nats"], "w1")
    try:
        seqs = [await w1.publish(ev.agent_subject(e), e) for e in _nonsense("w1")]
    finally:
        await w1.close()
    assert await fold.wait_for(seqs[-1], 5)
    assert not fold.state.proxies and not fold.state.sources
    assert fold.folder.rejected >= len(seqs)
    deadline = asyncio.get_running_loop().time() + 5
    while fold.dead_letters.sent < len(seqs) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    reasons = []
    for msg in await dlq_messages(log_client):
        if msg.subject.startswith("ppf.dlq.") and msg.headers:
            reasons.append((msg.subject, msg.headers["Ppf-Error"].split(":")[0]))
    assert reasons == [
        ("ppf.dlq.invalid", f)
        for f in ("proto", "latency_ms", "exit_ip", "urls", "urls", "urls", "urls")
    ]


async def test_the_admin_path_refuses_what_cannot_be_a_public_source(fleet: Any) -> None:
    """POST /v1/sources: loopback, link-local, private in any notation, local names and
    control characters are a 400 with the reason, outside lab mode."""
    client, fold, tokens = fleet
    for url in (
        "http://127.0.0.1/list.txt",
        "http://2130706433/list.txt",
        "http://0x7f.1/list.txt",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/x",
        "http://localhost/x",
        "http://intranet/x",
        "http://printer.local/x",
        "http://a.example/\x1b[31m",
        "ftp://a.example/list.txt",
    ):
        r = await client.post(
            "/v1/sources",
            json={"urls": [url]},
            headers={"Authorization": f"Bearer {tokens['root']}"},
        )
        assert r.status == 400, url
        assert (await r.json())["type"].endswith("/bad-url")
    assert not fold.state.sources


async def test_a_message_larger_than_any_event_is_never_stored(fleet: Any, log_client: Log) -> None:
    """1 MB of junk on an agent's own subject is refused by the server (the login's
    payload limit), stored nowhere, copied nowhere; the largest honest event passes."""
    client, _, tokens = fleet
    url = (await _me(client, tokens["w1"]))["nats"]
    head = await log_client.head_seq()
    junk = await Agent.connect(url, "w1")
    try:
        with pytest.raises(nats.errors.Error):  # refused, by the client or the server
            await junk.js.publish(
                "ppf.in.w1.proxy.8-8-8-8_80", b"x" * (1 << 20), headers={"Nats-Msg-Id": "j"}
            )
    finally:
        await junk.close()
    assert await log_client.head_seq() == head
    honest = await Agent.connect(url, "w1")
    try:
        big = ev.Extracted(
            id=fresh_id(),
            agent="w1",
            at=now_ms(),
            url_id="0123456789abcdef",
            count=1_000,
            candidates=[
                (f"8.8.{i // 250}.{i % 250 + 1}", 65535, "socks5", 0.99) for i in range(1_000)
            ],
            extractor="x" * 256,
        )
        assert len(ev.encode(big)) < ev.MAX_MESSAGE
        assert await honest.publish(ev.agent_subject(big), big) == head + 1
    finally:
        await honest.close()
