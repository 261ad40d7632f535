"""A client's tunnel as its protocol says it: a SOCKS5 handshake (RFC 1928, its login
RFC 1929) or an HTTP CONNECT, read into a tunnel ``Request`` and handed to the router
(``router/tunnels.py``), whose refusals are said back in the client's protocol (SOCKS5:
a reply code; HTTP: a short answer). The connection is a pair of streams by now
(``ClientSide._hand_over``)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable, Coroutine

from endpoint.connection.answers import answer, peer_address
from endpoint.link.request import TUNNEL, Request
from endpoint.router.door import Refused
from endpoint.router.login import Want, challenge
from endpoint.router.router import Router
from endpoint.router.tunnels import carry

__all__ = ["Carrier", "connect_tunnel", "hand_over", "socks"]

# What a tunnel's connection is handed to, as streams: ``socks`` or ``connect_tunnel``.
Carrier = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

_SOCKS_OK = b"\x05\x00\x00\x01" + bytes(6)
_CONNECT_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"


def hand_over(
    transport: asyncio.Transport, early: bytes, then: Carrier
) -> Coroutine[object, object, None]:
    """The client's connection made a pair of streams at once (what it sends next is
    theirs), ``early`` its bytes read already; the coroutine that gives them to ``then``
    and closes them after."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=65_536)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    if early:
        reader.feed_data(early)
    transport.resume_reading()

    async def run() -> None:
        try:
            await then(reader, writer)
        finally:
            writer.close()

    return run()


async def socks(router: Router, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A SOCKS5 client, its first byte (the version) read already."""
    try:
        await _socks(router, reader, writer)
    except (OSError, asyncio.IncompleteReadError, TimeoutError, UnicodeError):
        router.outcomes.count("client_error")


async def _socks(
    router: Router, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    async with asyncio.timeout(30):  # the handshake; the tunnel after it has none
        (count,) = await reader.readexactly(1)
        methods = await reader.readexactly(count)
        if 2 not in methods:  # user/password only: no login, no proxy
            writer.write(b"\x05\xff")
            return
        writer.write(b"\x05\x02")
        _, ulen = await reader.readexactly(2)
        user = (await reader.readexactly(ulen)).decode(errors="replace")
        (plen,) = await reader.readexactly(1)
        password = (await reader.readexactly(plen)).decode(errors="replace")
        want, _ = await router.door.login(  # SOCKS5 says no more than "refused"
            user, password, peer_address(writer.get_extra_info("peername"))
        )
        if want is None:
            router.outcomes.count("login_refused")
            writer.write(b"\x01\x01")
            return
        writer.write(b"\x01\x00")
        _, cmd, _, atyp = await reader.readexactly(4)
        if atyp == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif atyp == 4:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        elif atyp == 3:
            (n,) = await reader.readexactly(1)
            host = (await reader.readexactly(n)).decode("idna")
        else:
            writer.write(b"\x05\x08\x00\x01" + bytes(6))
            return
        port = int.from_bytes(await reader.readexactly(2), "big")
        if cmd != 1:  # CONNECT only
            writer.write(b"\x05\x07\x00\x01" + bytes(6))
            return
    req = Request(TUNNEL, f"{host}:{port}".encode(), host, port)
    try:
        async with router.door.slot(want):
            await carry(router, want, password, req, (reader, writer), _SOCKS_OK)
    except Refused as exc:
        writer.write(bytes([5, exc.socks, 0, 1]) + bytes(6))


async def connect_tunnel(
    router: Router,
    target: bytes,
    authorization: bytes,
    held: Want | None,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """A CONNECT, its head read (``connection/client.py``); ``held``: the login the
    connection showed before, whose slot this now holds."""
    try:
        want, password, why = await router.door.http_login(
            authorization, peer_address(writer.get_extra_info("peername"))
        )
        if want is None:
            router.outcomes.count("login_refused")
            writer.write(answer(407, why, challenge(why)))
            return
        host, _, port = target.decode(errors="replace").rpartition(":")
        if not host or not port.isdigit():
            writer.write(answer(400, "CONNECT host:port"))
            return
        router.door.leave(held)
        held = None
        req = Request(TUNNEL, target, host.strip("[]"), int(port), authorization=authorization)
        async with router.door.slot(want):
            await carry(router, want, password, req, (reader, writer), _CONNECT_OK)
    except Refused as exc:
        writer.write(answer(exc.status, str(exc)))
    except (OSError, TimeoutError):
        router.outcomes.count("client_error")
    finally:
        router.door.leave(held)
