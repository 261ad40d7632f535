"""Plain HTTP through an upstream, kept alive at both ends.

A scraper sends request after request on one connection to its proxy; each goes to an
upstream the strategy picks, on a connection kept from an earlier request to that
upstream when one is idle (``Idle``): an HTTP proxy's own connection (absolute URIs),
or a SOCKS tunnel to the same site. h11 reads both sides (framing, chunked bodies, HEAD,
1xx), so the client's connection stays open exactly as long as HTTP allows. What
refuses or says nothing is the proxy's failure (``Forwarder.failed``); an idle
connection that went stale is tried once more on a fresh one and blames nobody.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import h11

from endpoint.choose import Upstream

__all__ = ["Idle", "Link", "relay_response", "send_request"]

_HOP = frozenset(
    {
        b"proxy-authorization",
        b"proxy-connection",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
    }
)


@dataclass(slots=True)
class Link:
    """One connection to an upstream, with its own h11 client state."""

    up: Upstream
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    forward: bool  # an HTTP proxy: send it absolute URIs
    conn: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0
    reused: bool = False
    opened_at: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        self.writer.close()


@dataclass
class Idle:
    """Idle links by (upstream, site): taken for the next request, given back after it."""

    per_key: int = 64
    max_idle_s: float = 20.0
    # A link is reused for this long after it opened, then a fresh one is made: an
    # upstream that died for new connections (a tarpit, a restart) would otherwise keep
    # serving through old ones, and the endpoint never learn it, nor tell the fleet.
    max_age_s: float = 3.0
    links: dict[tuple[object, ...], list[Link]] = field(default_factory=dict)

    def take(self, key: tuple[object, ...], now: float) -> Link | None:
        stack = self.links.get(key)
        while stack:
            link = stack.pop()
            fresh = (
                now - link.idle_since <= self.max_idle_s and now - link.opened_at <= self.max_age_s
            )
            if fresh and not link.writer.is_closing():
                link.reused = True
                return link
            link.close()
        return None

    def close(self) -> None:
        for stack in self.links.values():
            for link in stack:
                link.close()
        self.links.clear()

    def give(self, key: tuple[object, ...], link: Link, now: float) -> None:
        conn = link.conn
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            link.close()
            return
        conn.start_next_cycle()
        stack = self.links.setdefault(key, [])
        if len(stack) >= self.per_key:
            link.close()
            return
        link.idle_since = now
        stack.append(link)


def hop_free(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in headers if n.lower() not in _HOP]


def send_request(link: Link, request: h11.Request, origin: bytes, body: bytes) -> None:
    target = request.target if link.forward else origin
    conn = link.conn
    out = conn.send(
        h11.Request(method=request.method, target=target, headers=hop_free(request.headers))
    )
    if body:
        out += conn.send(h11.Data(data=body))
    out += conn.send(h11.EndOfMessage())
    link.writer.write(out)


async def _event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(65_536))


async def relay_response(
    link: Link, client: h11.Connection, writer: asyncio.StreamWriter, answer_s: float
) -> bool | None:
    """Read the upstream's answer and give it to the client through ``client``, within
    ``answer_s`` for its head and as long again between pieces of its body. None:
    nothing came (the proxy's failure, or a stale idle link); False: it broke off
    mid-answer (the client's connection cannot go on); True: all of it was sent. What
    goes to the client is gathered and written in pieces of up to 64 KiB: one send for a
    small answer, not one per part of it."""
    out = bytearray()
    try:
        async with asyncio.timeout(answer_s):
            event = await _event(link.conn, link.reader)
            while isinstance(event, h11.InformationalResponse):
                out += client.send(event)
                event = await _event(link.conn, link.reader)
    except (OSError, TimeoutError, h11.RemoteProtocolError):
        return None
    if not isinstance(event, h11.Response):
        return None
    head = h11.Response(
        status_code=event.status_code, headers=hop_free(event.headers), reason=event.reason
    )
    out += client.send(head)
    try:
        while True:
            async with asyncio.timeout(answer_s):
                event = await _event(link.conn, link.reader)
            if isinstance(event, h11.Data):
                out += client.send(event)
                if len(out) >= 65_536:
                    writer.write(out)
                    out = bytearray()
                    await writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                out += client.send(h11.EndOfMessage())
                writer.write(out)
                return True
            else:  # closed mid-answer
                writer.write(out)
                return False
    except (OSError, TimeoutError, h11.RemoteProtocolError, h11.LocalProtocolError):
        writer.write(out)
        return False
