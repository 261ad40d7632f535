"""Walls of the rotating endpoint an attacker could walk through, tried as one would:
the real endpoint on a port, a recording upstream behind it, the real gateway for
logins. The floods among them (marker ``flood``) run apart from the rest of the suite."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

import events as ev
from eventlog.client import Log
from events.mint import fresh_id, now_ms
from tests.test_walls import _gateway


@contextlib.asynccontextmanager
async def _recording_upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    """An HTTP proxy on loopback that answers 200 to anything and records what came."""
    import asyncio

    heard: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            heard.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heard
    finally:
        server.close()
        await server.wait_closed()


async def test_the_endpoint_carries_no_request_to_an_inside_destination() -> None:
    """A consumer asks the rotating endpoint for a metadata address, loopback, a private
    address in a legacy notation, an internal name: 403 (SOCKS5: not allowed), and no
    upstream hears of it; a public destination is carried."""
    import asyncio
    import base64

    from endpoint.connection.client import serve
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router

    auth = b"Proxy-Authorization: Basic " + base64.b64encode(b"shop:t0ken") + b"\r\n"

    async def login_ok(name: str, token: str) -> bool:
        return token == "t0ken"

    async with _recording_upstream() as (up_port, heard):
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", up_port, "http", latency_ms=5)])
        relay = Router(pool, login_ok)
        server = await serve(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def ask(head: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

        try:
            for target in (
                b"http://169.254.169.254/latest/meta-data/",
                b"http://127.0.0.1:8080/admin",
                b"http://0x7f.1/",
                b"http://metadata.google.internal/",
                b"http://[::ffff:0:7f00:1]/",
            ):
                got = await ask(
                    b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" % (target, auth)
                )
                assert got.startswith(b"HTTP/1.1 403"), (target, got[:80])
            got = await ask(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n%s\r\n" % auth)
            assert got.startswith(b"HTTP/1.1 403"), got[:80]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x05\x01\x02")
            assert await reader.readexactly(2) == b"\x05\x02"
            writer.write(b"\x01\x04shop\x05t0ken")
            assert await reader.readexactly(2) == b"\x01\x00"
            writer.write(b"\x05\x01\x00\x01" + bytes([192, 168, 1, 1]) + (80).to_bytes(2, "big"))
            assert (await reader.readexactly(2))[1] == 2  # not allowed by the ruleset
            writer.close()
            assert heard == []
            got = await ask(
                b"GET http://93.184.216.34/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
                % auth
            )
            assert got.startswith(b"HTTP/1.1 200"), got[:80]
            assert len(heard) == 1 and heard[0].startswith(b"GET http://93.184.216.34/")
            assert relay.outcomes.counts["destination_refused"] == 7
        finally:
            server.close()
            await server.wait_closed()
            relay.close()


@pytest.mark.flood
async def test_the_endpoint_closes_a_head_that_trickles() -> None:
    """50 connections each sending a request head one byte at a time (every byte resets
    an idle timer) are closed once ``head_s`` has passed since their head began; a
    client that sends its head whole is answered beside them."""
    import asyncio
    import base64
    import time

    from endpoint.connection.client import serve
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router

    auth = b"Proxy-Authorization: Basic " + base64.b64encode(b"shop:t0ken") + b"\r\n"

    async def login_ok(name: str, token: str) -> bool:
        return token == "t0ken"

    async with _recording_upstream() as (up_port, _):
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", up_port, "http", latency_ms=5)])
        relay = Router(pool, login_ok, head_s=1.0)
        server = await serve(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def trickle() -> float:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            started = time.monotonic()
            try:
                for byte in b"GET http://93.184.216.34/ HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                    if reader.at_eof():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.1)
            except OSError:
                pass
            await asyncio.wait_for(reader.read(), 10)  # the endpoint's close
            writer.close()
            return time.monotonic() - started

        try:
            slow = asyncio.gather(*(trickle() for _ in range(50)))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"GET http://93.184.216.34/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
                % auth
            )
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
            writer.close()
            lasted = await asyncio.wait_for(slow, 15)
            # Closed at head_s, not at the idle timer's 30 s (slack for a loaded machine).
            assert all(1.0 <= s < 6.0 for s in lasted), sorted(lasted)
            assert relay.outcomes.counts["slow_head"] == 50
        finally:
            server.close()
            await server.wait_closed()
            relay.close()


@pytest.mark.flood
async def test_endpoint_logins_ask_once_forget_refusals_and_see_revocation(
    log_client: Log,
) -> None:
    """Against the real gateway: 200 connections logging in at once with one unknown
    login make one ask; a refusal is not kept (asked again next time); a flood of bad
    logins from one address is cut at the endpoint after its burst, while a consumer on
    another address logs in at once; a revoked consumer is refused within seconds."""
    import asyncio
    import base64
    import time

    from endpoint.connection.client import serve
    from endpoint.feed import Feed
    from endpoint.link.upstream import Upstream
    from endpoint.logins import LOGIN_FRESH_S
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router

    async with (
        _gateway(log_client, {"shop": "consumer"}) as (client, fold, tokens),
        _recording_upstream() as (up_port, _),
    ):
        pool = Pool()
        feed = Feed([str(client.make_url("")).rstrip("/")], pool, every_s=60)
        await feed.start()
        pool.replace([Upstream("127.0.0.1", up_port, "http", latency_ms=5)])
        relay = Router(pool, feed.logins.ok, login_known=feed.logins.known, login_failures_burst=20)
        server = await serve(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def get(login: bytes, source: str = "127.0.0.1") -> bytes:
            head = b"Proxy-Authorization: Basic " + base64.b64encode(login) + b"\r\n"
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
            writer.write(
                b"GET http://93.184.216.34/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
                % head
            )
            try:
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()

        try:
            answers = await asyncio.gather(*(get(b"ghost:nope") for _ in range(200)))
            assert all(a.startswith(b"HTTP/1.1 407") for a in answers)
            # One ask for all that came while it was out (a few when they came after it
            # ended: a refusal is not kept), never one a connection (200 before).
            asked = feed.logins.asks
            assert 1 <= asked <= 5, asked
            await get(b"ghost:nope", "127.0.0.3")  # an address with failures left
            assert feed.logins.asks == asked + 1  # the refusal was not kept
            flood = await asyncio.gather(*(get(b"ghost-%d:x" % i, "127.0.0.4") for i in range(100)))
            assert all(a.startswith(b"HTTP/1.1 407") for a in flood)
            assert feed.logins.asks <= asked + 1 + 20  # the burst asked, the rest cut here
            assert relay.outcomes.counts["login_limited"] >= 100 - 20
            started = time.monotonic()
            good = b"shop:" + tokens["shop"].encode()
            assert (await get(good, "127.0.0.2")).startswith(b"HTTP/1.1 200")
            assert time.monotonic() - started < 1.0
            revoke = ev.AgentEnrolled(
                id=fresh_id(),
                agent="admin",
                at=now_ms(),
                name="shop",
                role="consumer",
                token_sha256="",
            )
            assert await fold.wait_for((await log_client.publish(revoke)).seq, 5)
            revoked_at = time.monotonic()
            while (await get(good, "127.0.0.2")).startswith(b"HTTP/1.1 200"):
                assert time.monotonic() - revoked_at < LOGIN_FRESH_S + 3
                await asyncio.sleep(0.2)
        finally:
            server.close()
            await server.wait_closed()
            relay.close()
            await feed.stop()
