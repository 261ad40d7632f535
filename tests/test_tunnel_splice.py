"""A tunnel's two connections spliced (endpoint/link/tunnel.py ``pipe``): what either
end sent before the splice is carried, a slow reader loses no byte, and a client's end
of writing reaches the site as an end. Through
the real endpoint, CONNECT and SOCKS5, over ppf's bench upstreams (an HTTP proxy of its
own; microsocks, or its own SOCKS5)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator

import pytest

from endpoint.connection.client import serve
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.router import Router
from ops.bench.upstreams import upstream

TOKEN = "t"
BIG = 4 * 1024 * 1024


ENDS: list[bool] = []  # the site saw its client's end of writing (an EOF, not a reset)


async def _target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Speaks first; then lines are echoed, ``big`` sends BIG bytes, and at the client's
    end it says ``bye`` (which an upstream that closes both ways at an end never
    carries back) and closes."""
    writer.write(b"hello\n")
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while line := await reader.readline():
            if line == b"big\n":
                writer.write(bytes(range(256)) * (BIG // 256))
            else:
                writer.write(line)
            await writer.drain()
        ENDS.append(reader.at_eof())
        writer.write(b"bye")
        await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def _endpoint(kind: str) -> AsyncIterator[tuple[int, int]]:
    site = await asyncio.start_server(_target, "127.0.0.1", 0)
    async with upstream(kind) as up:
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", up.port, up.kind, https="yes", latency_ms=5)])

        async def login_ok(name: str, token: str) -> bool:
            return token == TOKEN

        router = Router(pool, login_ok, lab=True)
        server = await serve(router, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1], site.sockets[0].getsockname()[1]
        finally:
            server.close()
            router.close()
            site.close()


async def _open(how: str, port: int, target: int, early: bytes) -> asyncio.StreamReader:
    """A tunnel through the endpoint to ``target``, ``early`` sent with the request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if how == "connect":
        auth = base64.b64encode(f"me:{TOKEN}".encode())
        head = b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n"
        writer.write(head % (target, auth) + early)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    else:
        login = b"\x01\x02me\x01" + TOKEN.encode()
        writer.write(b"\x05\x01\x02" + login)
        writer.write(b"\x05\x01\x00\x01\x7f\x00\x00\x01" + target.to_bytes(2, "big") + early)
        assert await reader.readexactly(2) == b"\x05\x02"
        assert await reader.readexactly(2) == b"\x01\x00"
        assert (await reader.readexactly(10))[:2] == b"\x05\x00"
    reader.writer = writer  # type: ignore[attr-defined]
    return reader


@pytest.mark.parametrize(
    ("how", "kind"), [("connect", "http"), ("connect", "socks5"), ("socks5", "socks5")]
)
async def test_a_spliced_tunnel_carries_early_bytes_a_slow_read_and_its_end(
    how: str, kind: str
) -> None:
    """The site speaks first and the client's first line came with its request: both
    arrive. 4 MiB read slowly arrive whole and in order. The client's end of writing
    reaches the site as an end, and then the tunnel ends."""
    ENDS.clear()
    async with _endpoint(kind) as (port, target):
        reader = await asyncio.wait_for(_open(how, port, target, b"early\n"), 10)
        writer: asyncio.StreamWriter = reader.writer  # type: ignore[attr-defined]
        assert await asyncio.wait_for(reader.readline(), 10) == b"hello\n"
        assert await asyncio.wait_for(reader.readline(), 10) == b"early\n"
        writer.write(b"big\n")
        got = hashlib.sha256()
        left = BIG
        while left:
            chunk = await asyncio.wait_for(reader.read(min(left, 16_384)), 10)
            assert chunk, f"{left} bytes short"
            got.update(chunk)
            left -= len(chunk)
            if left > BIG // 2:
                await asyncio.sleep(0.001)  # a slow reader for the first half
        assert got.digest() == hashlib.sha256(bytes(range(256)) * (BIG // 256)).digest()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) in (b"", b"bye")
        writer.close()
        async with asyncio.timeout(5):
            while not ENDS:
                await asyncio.sleep(0.01)
        assert ENDS == [True]


async def test_a_sites_first_bytes_that_come_with_the_proxys_200_are_kept() -> None:
    """An HTTP proxy whose answer to CONNECT arrives in one piece with the site's first
    bytes (a site that speaks first, on a busy machine): the tunnel carries them. The
    CONNECT was python-socks' before, which reads the answer in one read and drops what
    follows its head (tests/test_tunnel_splice.py's first test failed so, now and then,
    in CI). A refusal is the proxy's own (``UpstreamRefused``) with its status."""
    from endpoint.link.tunnel import UpstreamRefused, open_stream

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"refused.example" in head:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\nhello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        up = Upstream("127.0.0.1", port, "http", https="yes")
        reader, writer = await open_stream(up, "site.example", 25, 5)
        assert await asyncio.wait_for(reader.readline(), 5) == b"hello\n"
        writer.close()
        with pytest.raises(UpstreamRefused) as refused:
            await open_stream(up, "refused.example", 443, 5)
        assert refused.value.code == 403
    finally:
        server.close()
