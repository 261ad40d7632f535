"""Bounds of the rotating endpoint, tried as an attacker would: the real endpoint (in its
own process where its memory is the question), the real gateway and NATS for logins.
Nothing a stranger sends is read before its login is known; a body must keep a pace;
a revoked consumer's open connections close; a host is read as an upstream reads it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import events as ev
from endpoint.connection.client import serve
from endpoint.feed import Feed
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.router import Router
from eventlog.client import Log
from events.mint import fresh_id, now_ms
from ops.nats.server import free_port
from tests.test_walls import _gateway
from tests.test_walls_endpoint import _recording_upstream

MB = 1_000_000
BODY = 16 * 1024 * 1024 - 1  # one byte short of the endpoint's largest body


def _basic(login: bytes) -> bytes:
    return b"Proxy-Authorization: Basic " + base64.b64encode(login) + b"\r\n"


def _peak_rss(pid: int) -> int:
    """The process's resident memory at its highest (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@contextlib.asynccontextmanager
async def _serve(ppf_bin: str, gateway: str) -> AsyncIterator[tuple[int, int]]:
    """``ppf serve`` in its own process against ``gateway``: (its port, its pid)."""
    port = free_port()
    argv = [ppf_bin, "serve", "--gateway", gateway, "--listen", f"127.0.0.1:{port}"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"proxy endpoint" in line, line
        yield port, proc.pid
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)


@pytest.mark.flood
async def test_a_strangers_body_is_never_read_and_a_drip_is_cut_in_the_heads_time(
    log_client: Log, ppf_bin: str
) -> None:
    """20 connections without a valid login each announce a body one byte short of 16 MiB
    and send it as fast as the socket takes: each is answered 407 before its body, and
    the endpoint's resident memory at its peak grows by at most 10 MB. Then 500
    connections drip a body a byte at a time after a whole head, 50 of them with a
    consumer's valid login: every one is closed within the head's time (10 s) and a
    little slack, not left open. The consumer's own 16 MiB upload at full speed is read
    whole."""
    async with _gateway(log_client, {"shop": "consumer"}) as (client, _, tokens):
        base = str(client.make_url("")).rstrip("/")
        async with _serve(ppf_bin, base) as (port, pid):
            # The consumer's login works once first: a login that worked passes the limit
            # on failed logins that the strangers spend from the same address.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            good = b"shop:" + tokens["shop"].encode()
            writer.write(b"GET http://93.184.216.34/ HTTP/1.1\r\nHost: x\r\n%s\r\n" % _basic(good))
            assert (await asyncio.wait_for(reader.read(12), 10)) == b"HTTP/1.1 503"
            writer.close()
            before = _peak_rss(pid)

            async def push(login: bytes) -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                head = b"POST http://93.184.216.34/upload HTTP/1.1\r\nHost: x\r\n"
                writer.write(head + _basic(login) + b"Content-Length: %d\r\n\r\n" % BODY)
                chunk, sent = b"\0" * 65_536, 0
                try:
                    while sent < BODY and not reader.at_eof():
                        writer.write(chunk[: BODY - sent])
                        await writer.drain()
                        sent += len(chunk)
                except OSError:
                    pass
                try:
                    return await asyncio.wait_for(reader.read(200), 20)
                except OSError as exc:
                    return repr(exc).encode()
                finally:
                    writer.close()

            answers = await asyncio.gather(*(push(b"shop:wrong-%d" % i) for i in range(20)))
            assert all(a.startswith(b"HTTP/1.1 407") for a in answers), answers[:3]
            grown = _peak_rss(pid) - before
            assert grown <= 10 * MB, grown
            # An honest upload of as much, at full speed, is read whole (then answered:
            # no proxy in this endpoint's empty pool).
            assert (await push(good)).startswith(b"HTTP/1.1 503")

            async def drip(login: bytes) -> float:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                started = time.monotonic()
                head = b"POST http://93.184.216.34/upload HTTP/1.1\r\nHost: x\r\n"
                writer.write(head + _basic(login) + b"Content-Length: 1000\r\n\r\n")
                try:
                    while not reader.at_eof() and time.monotonic() - started < 30:
                        writer.write(b"x")
                        await writer.drain()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(reader.read(200), 0.5)
                except OSError:
                    pass
                writer.close()
                return time.monotonic() - started

            drips = [drip(good if i % 10 == 0 else b"shop:wrong") for i in range(500)]
            lasted = await asyncio.gather(*drips)
            assert max(lasted) < 10.0 + 4.0, sorted(lasted)[-5:]
            logged_in = lasted[::10]
            assert min(logged_in) >= 9.0, sorted(logged_in)[:5]  # cut at the head's time


@contextlib.asynccontextmanager
async def _tunnelling_upstream() -> AsyncIterator[int]:
    """An HTTP proxy on loopback: CONNECT piped to its target, any other request 200."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65_536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b" ", 2)
            if method == b"CONNECT":
                host, _, port = target.decode().rpartition(":")
                tr, tw = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(pipe(reader, tw), pipe(tr, writer))
                return
            while True:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_revoked_consumers_tunnels_and_keep_alive_connections_close_within_10_s(
    log_client: Log,
) -> None:
    """A consumer holds a CONNECT tunnel carrying traffic and an idle keep-alive
    connection through the endpoint (the real gateway deciding logins); its token is
    revoked: both are closed within 10 s, where the tunnel ran on before."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    site = await asyncio.start_server(echo, "127.0.0.1", 0)
    site_port = site.sockets[0].getsockname()[1]
    async with (
        _gateway(log_client, {"shop": "consumer"}) as (client, fold, tokens),
        _tunnelling_upstream() as up_port,
    ):
        pool = Pool()
        feed = Feed([str(client.make_url("")).rstrip("/")], pool, every_s=60)
        await feed.start()
        pool.replace([Upstream("127.0.0.1", up_port, "http", https="yes", latency_ms=5)])
        relay = Router(
            pool,
            feed.logins.ok,
            login_known=feed.logins.known,
            login_still=feed.logins.still,
            lab=True,
        )
        server = await serve(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        auth = _basic(b"shop:" + tokens["shop"].encode())
        try:
            tr, tw = await asyncio.open_connection("127.0.0.1", port)
            tw.write(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n%s\r\n" % (site_port, auth))
            assert (await tr.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            kr, kw = await asyncio.open_connection("127.0.0.1", port)
            kw.write(b"GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: x\r\n%s\r\n" % (up_port, auth))
            assert (await kr.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
            revoke = ev.AgentEnrolled(
                id=fresh_id(), agent="admin", at=now_ms(), name="shop", role="consumer",
                token_sha256="",
            )  # fmt: skip
            assert await fold.wait_for((await log_client.publish(revoke)).seq, 5)
            revoked_at = time.monotonic()
            tunnel_closed = None
            while time.monotonic() - revoked_at < 20:
                tw.write(b"ping")
                try:
                    got = await asyncio.wait_for(tr.read(4), 0.3)
                except (TimeoutError, OSError):
                    got = b"?"
                if not got:
                    tunnel_closed = time.monotonic() - revoked_at
                    break
                await asyncio.sleep(0.2)
            left = 20 - (time.monotonic() - revoked_at)
            try:
                keep_alive = await asyncio.wait_for(kr.read(), max(0.1, left))
            except TimeoutError:
                keep_alive = b"still open"
            keep_alive_closed = time.monotonic() - revoked_at
            assert tunnel_closed is not None and tunnel_closed <= 10, tunnel_closed
            assert keep_alive == b"" and keep_alive_closed <= 10, keep_alive_closed
            assert relay.outcomes.counts["login_revoked"] >= 1
            tw.close()
            kw.close()
        finally:
            server.close()
            await server.wait_closed()
            relay.close()
            await feed.stop()
            site.close()


async def test_a_host_spelled_for_another_parser_is_read_before_the_address_rule() -> None:
    """``%31%32%37.0.0.1`` (127.0.0.1 percent-encoded) as a CONNECT's host, a SOCKS5
    name, or a request's host: refused (403, SOCKS5 reply 2; the request line's form
    fails the URL parse, 400), and no upstream hears of it; a public name is carried."""
    auth = _basic(b"shop:t0ken")

    async def login_ok(name: str, token: str) -> bool:
        return token == "t0ken"

    async with _recording_upstream() as (up_port, heard):
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", up_port, "http", https="yes", latency_ms=5)])
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

        async def socks(host: bytes) -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"\x05\x01\x02")
                assert await reader.readexactly(2) == b"\x05\x02"
                writer.write(b"\x01\x04shop\x05t0ken")
                assert await reader.readexactly(2) == b"\x01\x00"
                writer.write(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + b"\x01\xbb")
                return (await asyncio.wait_for(reader.readexactly(2), 5))[1]
            finally:
                writer.close()

        try:
            for target in (b"%31%32%37.0.0.1:443", b"%6c%6fcalhost:443", b"%31%30.0.0.1:8443"):
                got = await ask(b"CONNECT %s HTTP/1.1\r\n%s\r\n" % (target, auth))
                assert got.startswith(b"HTTP/1.1 403"), (target, got)
            assert await socks(b"%31%32%37.0.0.1") == 2
            for target in (b"%31%32%37.0.0.1", b"%6c%6fcalhost"):
                got = await ask(
                    b"GET http://%s/admin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
                    % (target, auth)
                )
                assert got[:12] in (b"HTTP/1.1 403", b"HTTP/1.1 400"), (target, got)
            assert heard == []
            got = await ask(
                b"GET http://example.com/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" % auth
            )
            assert got.startswith(b"HTTP/1.1 200") and len(heard) == 1
        finally:
            server.close()
            await server.wait_closed()
            relay.close()
