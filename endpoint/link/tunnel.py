"""Opening an upstream connection, and carrying a tunnel's bytes both ways.

Plain HTTP goes to an HTTP proxy itself (it is sent absolute URIs) or through a SOCKS
tunnel to the site (``open_link``); a client's tunnel (CONNECT, SOCKS5) is a SOCKS
tunnel or an HTTP proxy's CONNECT to the site (``open_stream``), whose bytes are then
piped both ways (``pipe``). A SOCKS5 handshake is link/socks.py's, driven from the
connection's callbacks; SOCKS4 is python-socks'. Either way a proxy's own refusal to
reach the site (a SOCKS reply's code, an HTTP proxy's status to CONNECT) is
``UpstreamRefused``, and its silence once it took the site (no reply to a CONNECT in
time, or a close before one; SOCKS4's first message names the site) ``UpstreamSilent``;
any other error is the proxy's.
"""

from __future__ import annotations

import asyncio
from typing import cast

import httptools
from python_socks import ProxyError, ProxyTimeoutError, ProxyType
from python_socks.async_.asyncio.v2 import Proxy

from endpoint.link.hello import hello_size
from endpoint.link.socks import Socks5Hello, UpstreamRefused, UpstreamSilent, open_socks5
from endpoint.link.uplink import UpLink
from endpoint.link.upstream import Upstream

__all__ = [
    "Stream",
    "UpstreamRefused",
    "UpstreamSilent",
    "first_bytes",
    "first_record",
    "open_link",
    "open_stream",
    "pipe",
]

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _socks4(up: Upstream, host: str, port: int, connect_s: float) -> Stream:
    """A connection tunnelled by SOCKS4 proxy ``up`` to the site, as python-socks'
    streams (v2: a transport the caller may take over). socksio, which speaks SOCKS5
    here, cannot send SOCKS4's empty user id."""
    proxy = Proxy(ProxyType.SOCKS4, up.ip, up.port, rdns=True)
    try:
        stream = await proxy.connect(host, port, timeout=connect_s)
    except ProxyError as exc:
        if exc.error_code:  # the proxy's reply: it would not reach the site
            raise UpstreamRefused(str(exc), exc.error_code) from exc
        raise
    except ProxyTimeoutError as exc:
        # SOCKS4 names the site in its first message, and python-socks times the
        # connect and the reply as one: a proxy reaching for a site that never answers
        # is as silent as a dead one (a refused connect is ProxyConnectionError).
        raise UpstreamSilent(f"no reply from the SOCKS4 proxy within {connect_s} s") from exc
    return stream.reader, stream.writer


def _as_stream(hello: Socks5Hello) -> Stream:
    """A SOCKS5 connection, its handshake done, as streams (what a tunnel pipes); what
    came after the reply is the stream's first bytes."""
    loop = asyncio.get_running_loop()
    assert hello.transport is not None
    reader = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    hello.transport.set_protocol(protocol)
    protocol.connection_made(hello.transport)
    if hello.rest:
        reader.feed_data(hello.rest)
    if hello.ended:
        reader.feed_eof()
    return reader, asyncio.StreamWriter(hello.transport, protocol, reader, loop)


async def open_stream(up: Upstream, host: str, port: int, connect_s: float) -> Stream:
    """A tunnel to ``host:port`` through ``up``, as streams. An HTTP proxy's CONNECT is
    asked here, not by python-socks: it reads the proxy's answer in one read and drops
    what came after its head in it, the site's first bytes when the site speaks first;
    a stream keeps them for the tunnel (``pipe`` takes what it holds)."""
    if up.proto == "socks5":
        return _as_stream(await open_socks5(up.ip, up.port, host, port, connect_s))
    if up.proto not in ("http", "https"):
        return await _socks4(up, host, port, connect_s)
    asked = False
    try:
        async with asyncio.timeout(connect_s):
            reader, writer = await asyncio.open_connection(up.ip, up.port)
            try:
                target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                asked = True
                status = _status(await reader.readuntil(b"\r\n\r\n"))
            except BaseException:
                writer.close()
                raise
    except (TimeoutError, EOFError, ConnectionError) as exc:
        if asked:  # it took the destination, and said nothing of it
            raise UpstreamSilent(f"no answer to CONNECT: {type(exc).__name__}") from exc
        raise
    if status != 200:
        writer.close()
        raise UpstreamRefused(f"the proxy answered CONNECT with {status}", status)
    return reader, writer


class _Head:
    """httptools' reader of an answer's head, for its status alone."""

    def on_headers_complete(self) -> None:
        raise _HeadRead


class _HeadRead(Exception):
    pass


def _status(head: bytes) -> int:
    parser = httptools.HttpResponseParser(_Head())
    try:
        parser.feed_data(head)
    except httptools.HttpParserCallbackError:
        return int(parser.get_status_code())
    raise ConnectionError("the proxy's answer to CONNECT is not an HTTP answer's head")


async def open_link(
    up: Upstream, host: str, port: int, key: tuple[object, ...], connect_s: float, answer_s: float
) -> UpLink:
    """A new connection for plain HTTP: to an HTTP proxy itself (it is sent absolute
    URIs), or a SOCKS tunnel to the site; within ``connect_s``."""
    loop = asyncio.get_running_loop()
    forward = up.proto in ("http", "https")

    def made() -> UpLink:
        return UpLink(up, forward, key, answer_s)

    if forward:
        async with asyncio.timeout(connect_s):
            _, link = await loop.create_connection(made, up.ip, up.port)
        return link
    if up.proto == "socks5":
        hello = await open_socks5(up.ip, up.port, host, port, connect_s)
        assert hello.transport is not None
        link = made()
        transport, held, ended = hello.transport, hello.rest, hello.ended
    else:
        reader, writer = await _socks4(up, host, port, connect_s)
        link = made()
        link.writer, transport = writer, cast(asyncio.Transport, writer.transport)
        held, ended = _taken(reader)
    # Nothing came after the reply unless the site spoke first (not HTTP).
    transport.set_protocol(link)
    link.connection_made(transport)
    if held:
        link.data_received(held)  # a link spoken on before it was asked is not used
    if ended or transport.is_closing():
        link.connection_lost(None)  # it ended before it was asked: nothing goes on it
    return link


async def first_record(reader: asyncio.StreamReader, within_s: float) -> bytes | None:
    """``first_bytes``, read on while they begin a TLS record not yet whole (a
    ClientHello may come in several reads), up to one record, within ``within_s``."""
    data = await first_bytes(reader, within_s)
    try:
        async with asyncio.timeout(within_s):
            while data and (size := hello_size(data)) is not None and len(data) < size:
                more = await reader.read(size - len(data))
                if not more:
                    break
                data += more
    except (TimeoutError, OSError):
        pass
    return data


async def first_bytes(reader: asyncio.StreamReader, within_s: float) -> bytes | None:
    """The first bytes ``reader`` gives (b"": it closed, or was reset, first); None when
    none came within ``within_s`` (nothing is read then)."""
    try:
        async with asyncio.timeout(within_s):
            return await reader.read(65_536)
    except TimeoutError:
        return None
    except OSError:
        return b""


async def pipe(client: Stream, upstream: Stream) -> None:
    """Both ways until both ends are done, or either is closed. The two connections are
    spliced: each end's protocol writes what it receives straight to the other's
    transport (no stream, no task between), and stops reading while the other's buffer
    is full; what the streams held already goes first."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    near, far = _Splice(client[1].transport, done), _Splice(upstream[1].transport, done)
    near.other, far.other = far, near
    try:
        for end, (reader, _) in ((near, client), (far, upstream)):
            held, ended = _taken(reader)
            end.transport.set_protocol(end)
            if not end.transport.is_closing():
                end.transport.resume_reading()  # its stream may have paused it, full
            if held:
                end.other.transport.write(held)
            if ended:
                end.eof_received()
            if end.transport.is_closing():
                end.connection_lost(None)
        await done
    finally:
        near.transport.close()
        far.transport.close()


def _taken(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What ``reader`` holds unread, taken from it, and whether its end came. asyncio
    has no public way to take a stream's buffer without waiting for more, so it is read
    here, in one place, from the attributes StreamReader has kept since Python 3.4."""
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    held = bytes(buffer)
    buffer.clear()
    return held, reader.at_eof()


class _Splice(asyncio.Protocol):
    """One end of a tunnel spliced to the other (``pipe``)."""

    other: _Splice

    def __init__(self, transport: asyncio.BaseTransport, done: asyncio.Future[None]) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.done = done
        self.ended = False  # its end came: it sends no more

    def data_received(self, data: bytes) -> None:
        self.other.transport.write(data)

    def eof_received(self) -> bool:
        self.ended = True
        other = self.other.transport
        if not other.is_closing() and other.can_write_eof():
            other.write_eof()
        if self.other.ended:
            self.connection_lost(None)
        return True  # half closed: the other way may still carry bytes

    def pause_writing(self) -> None:
        self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.other.transport.close()
        if not self.done.done():
            self.done.set_result(None)
