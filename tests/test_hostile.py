"""A hostile caller against the real gateway (issue 11, its first probes): what it sends
gets a 4xx, never a 500, and guessing tokens is slowed down by address."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from agents.seeds import source_added
from eventlog.client import Log
from events import MAX_MESSAGE, Released
from events.mint import fresh_id, now_ms
from gateway.app import make_app
from gateway.http import GatewayConfig
from ops.cli.admin import enroll
from projections.deadletters import DLQ_COPY_BYTES
from projections.live import FoldService
from tests.fleet import serving
from tests.helpers import worked


@contextlib.asynccontextmanager
async def _gateway(
    lg: Log, workers: tuple[str, ...], config: GatewayConfig | None = None
) -> AsyncIterator[tuple[Any, FoldService, dict[str, str]]]:
    """A real gateway on a real port, its fold caught up with the log, and a token for
    each of ``workers``."""
    tokens = {w: await enroll(lg, w, "worker") for w in workers}
    async with serving(lg, config) as (client, fold):
        yield client, fold, tokens


@pytest.fixture
async def gw(log_client: Log) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    config = GatewayConfig(
        auth_failures_burst=5, auth_failures_per_s=0.01, auth_failure_delay_s=0.2
    )
    async with _gateway(log_client, ("w1",), config) as (client, _, tokens):
        yield client, tokens


async def test_deeply_nested_json_is_a_400_not_a_500(gw: Any) -> None:
    """100,000 levels of brackets overflow the decoder: the client's fault, answered so."""
    client, tokens = gw
    deep = b'{"events": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    r = await client.post(
        "/v1/events",
        data=deep,
        headers={"Authorization": f"Bearer {tokens['w1']}", "Content-Type": "application/json"},
    )
    assert r.status == 400
    body = await r.json(content_type=None)
    assert body["type"].endswith("/undecodable-body") and "deep" in body["detail"]


async def test_failed_authentication_is_limited_per_address_and_logged_with_it(
    gw: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five wrong tokens answered 401, then 429 (slowed) for the address; a right token
    from that same address still works; each failure's log line names the peer."""
    client, tokens = gw
    for i in range(5):
        r = await client.get("/v1/agents/me", headers={"Authorization": f"Bearer guess-{i}"})
        assert r.status == 401
    started = time.monotonic()
    r = await client.get("/v1/agents/me", headers={"Authorization": "Bearer guess-6"})
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert time.monotonic() - started >= 0.2  # the configured delay of a refusal
    r = await client.get("/v1/agents/me", headers={"Authorization": f"Bearer {tokens['w1']}"})
    assert r.status == 200
    logged = [line for line in capsys.readouterr().out.splitlines() if "auth_failed" in line]
    assert len(logged) == 6 and all("peer=127.0.0.1" in line for line in logged)


async def test_a_thousand_wrong_tokens_never_refuse_the_valid_agent_beside_them(
    log_client: Log,
) -> None:
    """1,000 wrong tokens from one address, 100 at a time, while a worker on the same
    address asks who it is and takes leases: none of its requests is answered 429; of
    the wrong tokens, the burst and one per period are answered 401, all others 429."""
    burst, rate = 20, 2.0
    config = GatewayConfig(
        auth_failures_burst=burst, auth_failures_per_s=rate, auth_failure_delay_s=0.05
    )
    async with _gateway(log_client, ("w1",), config) as (client, _, tokens):
        good = {"Authorization": f"Bearer {tokens['w1']}"}
        honest: list[int] = []
        done = asyncio.Event()

        async def agent() -> None:
            while not done.is_set():
                honest.append((await client.get("/v1/agents/me", headers=good)).status)
                body = {"agent": "w1", "kind": "source", "count": 1, "ttl_s": 30}
                honest.append((await client.post("/v1/leases", json=body, headers=good)).status)

        async def wrong(i: int) -> int:
            headers = {"Authorization": f"Bearer wrong-{i}"}
            return (await client.get("/v1/agents/me", headers=headers)).status

        started = time.monotonic()
        keeper = asyncio.create_task(agent())
        statuses: list[int] = []
        for wave in range(10):
            statuses += await asyncio.gather(*(wrong(wave * 100 + i) for i in range(100)))
        elapsed = time.monotonic() - started
        done.set()
        await keeper
    assert len(statuses) == 1_000 and set(statuses) <= {401, 429}
    assert len(honest) >= 10 and 429 not in honest and set(honest) == {200}, set(honest)
    answered = statuses.count(401)
    assert burst <= answered <= burst + rate * elapsed + 1, (answered, elapsed)


async def test_forwarded_for_is_believed_only_from_the_operators_proxies(log_client: Log) -> None:
    """Behind a named reverse proxy (here: loopback), clients are told apart by
    X-Forwarded-For; anyone else's X-Forwarded-For is ignored, so a guesser cannot dodge
    its limit by inventing addresses."""
    limits = {"auth_failures_burst": 2, "auth_failures_per_s": 0.01, "auth_failure_delay_s": 0}

    async def statuses(config: GatewayConfig) -> list[int]:
        async with _gateway(log_client, ("w1",), config) as (client, _, _):
            out = []
            for i in range(6):  # three clients, two wrong tokens each, then one more each
                hdrs = {"Authorization": f"Bearer x{i}", "X-Forwarded-For": f"9.9.9.{i % 3}"}
                out.append((await client.get("/v1/agents/me", headers=hdrs)).status)
            return out

    assert await statuses(GatewayConfig(trusted_proxies=("127.0.0.1",), **limits)) == [401] * 6
    assert await statuses(GatewayConfig(**limits)) == [401, 401, 429, 429, 429, 429]


async def test_junk_is_not_copied_whole_into_the_dlq(log_client: Log) -> None:
    """The largest junk the stream stores (a megabyte it refuses outright: see
    test_agent_identity): the DLQ entry keeps the first 16 KB and the original size;
    the log keeps the rest."""
    junk = b"{" + b"x" * (MAX_MESSAGE - 1024)
    await log_client.publish_raw("ppf.proxy.1-1-1-1_1", junk, msg_id="junk-1")
    fold = FoldService(log_client, db=None)
    await fold.start()
    try:
        assert await fold.wait_for(await log_client.head_seq(), 10)
        for _ in range(100):
            if fold.dead_letters.sent:
                break
            await asyncio.sleep(0.05)
        sub = await log_client.js.subscribe("ppf.dlq.undecodable", ordered_consumer=True)
        try:
            msg = await sub.next_msg(timeout=5)
        finally:
            await sub.unsubscribe()
        assert msg.data == junk[:DLQ_COPY_BYTES]
        assert (msg.headers or {})["Ppf-Size"] == str(len(junk))
    finally:
        await fold.stop()


@pytest.mark.parametrize("name", ["admin", "Admin", "fold", "local-worker"])
def test_the_services_own_names_are_never_issued(ppf_bin: str, name: str) -> None:
    """A worker named `admin` (or `fold`, whose name Located carries) would publish as
    the service: refused before anything is written."""
    out = subprocess.run(
        [ppf_bin, "token", "issue", name, "--role", "worker", "--nats", "nats://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "reserved" in out.stderr and not out.stdout


async def test_a_release_of_a_lease_the_caller_does_not_hold_is_refused(log_client: Log) -> None:
    """w2 may not free w1's live lease, nor release a lease that never was (which made a
    ledger row); w1 releases its own."""
    await log_client.publish_many(source_added({"http://lists.example.net/a.txt": ""}, "manual"))
    async with _gateway(log_client, ("w1", "w2")) as (client, fold, tokens):
        r = await client.post(
            "/v1/leases",
            json={"agent": "w1", "kind": "source", "count": 1, "ttl_s": 60},
            headers={"Authorization": f"Bearer {tokens['w1']}"},
        )
        [grant] = (await r.json())["leases"]

        async def release(who: str, lease: str, target: str) -> Any:
            event = Released(
                id=fresh_id(), agent=who, at=now_ms(), lease=lease, target=target, outcome="done"
            )
            body = {"events": [msgspec.to_builtins(event)]}
            auth = {"Authorization": f"Bearer {tokens[who]}"}
            return await client.post("/v1/events", json=body, headers=auth)

        head = await log_client.head_seq()
        r = await release("w2", grant["lease"], grant["target"])
        assert r.status == 400
        [error] = (await r.json(content_type=None))["errors"]
        assert error["field"] == "lease" and "does not hold" in error["reason"]
        r = await release("w2", "0190c3a2-0000-7000-8000-000000000000", "made-up-target")
        assert r.status == 400
        assert await log_client.head_seq() == head  # nothing of either was published
        assert "made-up-target" not in fold.state.leases
        assert fold.state.leases[grant["target"]].holder == "w1"
        r = await release("w1", grant["lease"], grant["target"])
        assert r.status == 200, await r.text()


async def test_another_agents_event_id_drops_nothing(log_client: Log) -> None:
    """Ids are scoped per agent (``Nats-Msg-Id`` is ``<agent>:<id>``): w2 re-using the id
    w1's event holds is stored all the same, and a real re-send is reported as the
    duplicate it is (`duplicates: 1`), storing nothing."""
    async with _gateway(log_client, ("w1", "w2")) as (client, fold, tokens):
        first = worked(ip="8.8.8.8", agent="w1")

        async def post(who: str, event: Any) -> Any:
            body = {"events": [msgspec.to_builtins(event)]}
            auth = {"Authorization": f"Bearer {tokens[who]}"}
            r = await client.post("/v1/events", json=body, headers=auth)
            assert r.status == 200, await r.text()
            return await r.json()

        assert (await post("w1", first))["duplicates"] == 0
        taken = msgspec.structs.replace(worked(ip="9.9.9.9", agent="w2"), id=first.id)
        head = await log_client.head_seq()
        assert (await post("w2", taken))["duplicates"] == 0
        assert await log_client.head_seq() == head + 1
        assert (await post("w2", taken))["duplicates"] == 1  # its own re-send
        assert await log_client.head_seq() == head + 1
        assert await fold.wait_for(head + 1, 5)
        assert ("9.9.9.9", 8080) in fold.state.proxies


async def test_slow_headers_and_connection_floods_are_cut(log_client: Log) -> None:
    """Slowloris: connections that never finish their headers (or send nothing) are
    closed after the header timeout; past the cap a new connection gets a 503 at once;
    afterwards the gateway answers as before."""
    from aiohttp import web

    from gateway.guard import GuardedRunner
    from ops.nats.server import free_port

    fold = FoldService(log_client, db=None)
    await fold.start()
    runner = GuardedRunner(
        make_app(fold, log_client), access_log=None, max_connections=20, header_timeout_s=1.0
    )
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for i in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:  # half send part of a request, half nothing at all
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: ppf\r\nX-Slow: ")
                await writer.drain()
            held.append((reader, writer))
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), 2)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        writer.close()
        assert runner.guard.refused == 1
        # Still no headers after the timeout: each held connection is closed by the gateway.
        for reader, _ in held:
            assert await asyncio.wait_for(reader.read(), 4) == b""
        assert runner.guard.timed_out == 20
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: ppf\r\nConnection: close\r\n\r\n")
        await writer.drain()
        assert (await asyncio.wait_for(reader.read(), 4)).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        for _, writer in held:
            writer.close()
        await runner.cleanup()
        await fold.stop()
