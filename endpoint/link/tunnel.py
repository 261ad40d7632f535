"""Opening an upstream connection, and carrying a tunnel's bytes both ways.

Plain HTTP goes to an HTTP proxy itself (it is sent absolute URIs) or through a SOCKS
tunnel to the site (``open_link``); a client's tunnel (CONNECT, SOCKS5) is a SOCKS
tunnel or an HTTP proxy's CONNECT to the site (``open_stream``), whose bytes are then
piped both ways (``pipe``). python-socks speaks to the proxy; it raises its own errors
as well as the OS's, all the proxy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from python_socks import ProxyType
from python_socks.async_.asyncio import Proxy

from endpoint.link.uplink import UpLink
from endpoint.link.upstream import Upstream

__all__ = ["Stream", "first_bytes", "open_link", "open_stream", "pipe"]

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_TYPES = {"socks5": ProxyType.SOCKS5, "socks4": ProxyType.SOCKS4}


async def _through(up: Upstream, host: str, port: int, connect_s: float) -> socket.socket:
    """A socket tunnelled by ``up`` (SOCKS, or an HTTP proxy's CONNECT) to the site."""
    proxy = Proxy.create(_TYPES.get(up.proto, ProxyType.HTTP), up.ip, up.port, rdns=True)
    sock: socket.socket = await proxy.connect(host, port, timeout=connect_s)
    return sock


async def open_stream(up: Upstream, host: str, port: int, connect_s: float) -> Stream:
    """A tunnel to ``host:port`` through ``up``, as streams."""
    return await asyncio.open_connection(sock=await _through(up, host, port, connect_s))


async def open_link(
    up: Upstream, host: str, port: int, key: tuple[object, ...], connect_s: float, answer_s: float
) -> UpLink:
    """A new connection for plain HTTP: to an HTTP proxy itself (it is sent absolute
    URIs), or a SOCKS tunnel to the site; within ``connect_s``."""
    loop = asyncio.get_running_loop()
    forward = up.proto in ("http", "https")

    def made() -> UpLink:
        return UpLink(up, forward, key, answer_s)

    async with asyncio.timeout(connect_s):
        if forward:
            _, link = await loop.create_connection(made, up.ip, up.port)
        else:
            sock = await _through(up, host, port, connect_s)
            _, link = await loop.create_connection(made, sock=sock)
    return link


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
    """Both ways until both ends are done."""
    (cr, cw), (ur, uw) = client, upstream
    try:
        await asyncio.gather(_copy(cr, uw), _copy(ur, cw))
    finally:
        uw.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65_536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()
