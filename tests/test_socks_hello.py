"""The SOCKS5 handshake the endpoint drives from its connection's callbacks
(endpoint/link/socks.py), against upstreams that answer as real ones may: a reply in
pieces, the site's first bytes in one read with it, a short refusal then a close, a
login asked for, bytes that are not SOCKS5, silence. microsocks and dante (the
suite's real upstreams) carry the endpoint's own tests (tests/test_endpoint.py,
tests/test_forward.py); these are what they never send."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from endpoint.link.socks import UpstreamRefused, UpstreamSilent, open_socks5, reply_size
from endpoint.link.tunnel import open_stream
from endpoint.link.upstream import Upstream

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
GRANTED = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90"  # bound to 127.0.0.1:8080


async def _greeting_then_connect(reader: asyncio.StreamReader) -> bytes:
    """The client's greeting (no login offered) and its CONNECT, as a server reads them."""
    assert await reader.readexactly(3) == b"\x05\x01\x00"
    head = await reader.readexactly(5)
    assert head[:4] == b"\x05\x01\x00\x03", head  # a name, resolved by the proxy
    return await reader.readexactly(head[4] + 2)


async def _silent(opening: Awaitable[object]) -> None:
    """``opening`` (bounded at 0.5 s) ends as ``UpstreamSilent``, within 2 s."""
    started = asyncio.get_running_loop().time()
    with pytest.raises(UpstreamSilent):
        await opening
    assert asyncio.get_running_loop().time() - started < 2.0


async def _with(serve: Serve, then: Callable[[int], Awaitable[None]]) -> None:
    """``serve`` as an upstream on a loopback port while ``then`` runs against it; each of
    its connections closed when it is done with it, or when ``then`` is."""
    handlers: list[asyncio.Task[None]] = []

    async def each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await serve(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(each, "127.0.0.1", 0)
    try:
        await then(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def test_a_reply_in_pieces_and_the_sites_first_bytes_with_it() -> None:
    """A reply that comes a byte at a time is waited for whole (its bound address a name,
    whose length is in the reply), and the site's first bytes that come in the same
    write as its end go to the tunnel, not lost."""
    asked: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x05")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"\x00")
        asked.append(await _greeting_then_connect(reader))
        name = b"proxy.example"
        reply = b"\x05\x00\x00\x03" + bytes([len(name)]) + name + b"\x04\x38"
        for i in range(len(reply) - 1):
            writer.write(reply[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(reply[-1:] + b"220 smtp.example ready\r\n")
        await writer.drain()
        await reader.read()
        writer.close()

    async def then(port: int) -> None:
        up = Upstream("127.0.0.1", port, "socks5")
        reader, writer = await open_stream(up, "bücher.example", 25, 5)
        async with asyncio.timeout(5):
            assert await reader.readline() == b"220 smtp.example ready\r\n"
        writer.close()

    await _with(serve, then)
    # The name went as IDNA, its port after it.
    assert asked == [b"xn--bcher-kva.example" + (25).to_bytes(2, "big")]


@pytest.mark.parametrize(
    ("reply", "code"),
    [(b"\x05\x05", 5), (b"\x05\x02\x00\x01\x00\x00\x00\x00\x00\x00", 2)],
)
async def test_a_refusal_is_the_proxys_word_with_its_code(reply: bytes, code: int) -> None:
    """A CONNECT refused is ``UpstreamRefused`` with the reply's code (what the router
    reads as the site not reached through that proxy), whether the proxy sends its
    whole reply, or two bytes of it and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x05\x00")
        await _greeting_then_connect(reader)
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def then(port: int) -> None:
        with pytest.raises(UpstreamRefused) as refused:
            await open_socks5("127.0.0.1", port, "site.example", 80, within_s=5)
        assert refused.value.code == code

    await _with(serve, then)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"\x05\x02", "asks for a login"),  # username and password
        (b"\x05\xff", "asks for a login"),  # no method acceptable
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not SOCKS5"),  # an HTTP proxy
        (b"\x05\x00" + b"\x04\x00\x00\x01" + bytes(6), "not SOCKS5"),  # SOCKS4's reply
        (b"\x05\x00" + b"\x05\x09\x00", "code 9 is not RFC 1928's"),  # a code it does not name
        (b"", "closed"),
    ],
)
async def test_an_upstream_that_does_not_speak_socks5_fails_as_the_proxys(
    answer: bytes, why: str
) -> None:
    """A proxy that asks for a login, answers in another protocol or with a reply code
    RFC 1928 does not name (python-socks read it so too), or closes: a failure of the
    proxy's (a ConnectionError or socksio's ProtocolError), never a refusal that
    would be charged to the site."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(3)
        writer.write(answer)
        if answer.startswith(b"\x05\x00"):
            await reader.readexactly(5)
        await writer.drain()
        writer.close()

    async def then(port: int) -> None:
        with pytest.raises(Exception) as failed:
            await open_socks5("127.0.0.1", port, "site.example", 80, within_s=5)
        assert not isinstance(failed.value, UpstreamRefused | TimeoutError), failed.value
        if why != "not SOCKS5":
            assert why in str(failed.value)

    await _with(serve, then)


async def test_a_silent_proxy_is_bounded_and_its_connection_closed() -> None:
    """A proxy that takes the connection and never answers its greeting: ``within_s``
    ends the wait as a timeout (the proxy's failure: it never took a destination), and
    the connection is closed (the proxy sees its end)."""
    ended = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client's end
        ended.set()

    async def then(port: int) -> None:
        with pytest.raises(TimeoutError) as silent:
            await open_socks5("127.0.0.1", port, "site.example", 80, within_s=0.3)
        assert not isinstance(silent.value, UpstreamSilent)
        async with asyncio.timeout(5):
            await ended.wait()

    await _with(serve, then)


@pytest.mark.parametrize("closes", [False, True])
async def test_a_proxy_silent_after_its_connect_is_told_apart(closes: bool) -> None:
    """A proxy that greets, takes the CONNECT and then says nothing (as one reaching for
    a destination that never answers), or closes with no reply: ``UpstreamSilent``,
    which the router charges to the proxy only within the consumer's share, since the
    consumer names the destination (router/charges.py ``failed_on_the_way``); the wait
    bounded by ``within_s`` and the connection closed."""
    ended = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x05\x00")
        await _greeting_then_connect(reader)
        if closes:
            writer.close()
        else:
            await reader.read()  # until the client's end
        ended.set()

    async def then(port: int) -> None:
        await _silent(open_socks5("127.0.0.1", port, "site.example", 80, within_s=0.5))
        async with asyncio.timeout(5):
            await ended.wait()

    await _with(serve, then)


def test_a_replys_size_is_read_from_its_address_type() -> None:
    """RFC 1928 §6: an IPv4 reply is 10 bytes, an IPv6 one 22, a name's 7 and its
    length; unknown until the fifth byte."""
    assert reply_size(b"\x05\x00\x00\x01") is None
    assert reply_size(GRANTED[:5]) == len(GRANTED) == 10
    assert reply_size(b"\x05\x00\x00\x04\x00") == 22
    assert reply_size(b"\x05\x00\x00\x03\x0d") == 4 + 1 + 13 + 2


@pytest.mark.parametrize("closes", [False, True])
async def test_an_http_proxy_silent_after_connect_is_told_apart(closes: bool) -> None:
    """An HTTP proxy that reads a tunnel's CONNECT and answers nothing, or closes: as a
    SOCKS5 proxy silent after its CONNECT, ``UpstreamSilent`` within the connect time;
    one that answers a status other than 200 is ``UpstreamRefused`` with it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"CONNECT site.example:443 ")
        if not closes:
            await reader.read()  # until the client's end

    async def then(port: int) -> None:
        await _silent(open_stream(Upstream("127.0.0.1", port, "http"), "site.example", 443, 0.5))

    await _with(serve, then)

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async def refused(port: int) -> None:
        with pytest.raises(UpstreamRefused) as told:
            await open_stream(Upstream("127.0.0.1", port, "http"), "site.example", 443, 5)
        assert told.value.code == 502

    await _with(refuse, refused)


async def test_a_socks4_proxy_silent_after_its_request_is_told_apart() -> None:
    """A SOCKS4 proxy that reads its request (which names the site) and answers nothing:
    ``UpstreamSilent`` within the connect time, as a SOCKS5 one silent after its
    CONNECT; one that refuses the connection itself stays the proxy's failure."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readexactly(8)
        assert head[:2] == b"\x04\x01", head  # SOCKS4, CONNECT
        await reader.read()  # until the client's end

    async def then(port: int) -> None:
        await _silent(open_stream(Upstream("127.0.0.1", port, "socks4"), "site.example", 80, 0.5))

    await _with(serve, then)
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        up = Upstream("127.0.0.1", held.getsockname()[1], "socks4")
        with pytest.raises(OSError) as refused:
            await open_stream(up, "site.example", 80, 0.5)
        assert not isinstance(refused.value, UpstreamSilent | TimeoutError)
