"""A client's tunnel (CONNECT, SOCKS5) routed: opened through an upstream that can
tunnel, retried through others, and carried both ways.

To a TLS port, the client's first bytes (its ClientHello) are kept until the site
answers: a site that closes before its first byte, or answers with a TLS alert, is tried
through another proxy with the same bytes, the client none the wiser, at most
``attempts`` upstreams in all receiving them. Such a refusal is read as the site turning
that exit away only where another exit's handshake with the site got through lately
(``router/handshakes.py``): else it may be the client's own bytes drawing an alert from
every exit, and teaches nothing. The site's first byte says only that it let the exit
in: its page, which may still be a block, is the client's to read, not ours. A proxy
that answers but will not tunnel to the host (its own refusal, or the site's from its
exit) was turned away by the site, not a failure of the proxy's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import dataclass

from endpoint.link.hello import server_name
from endpoint.link.request import Request
from endpoint.link.tunnel import (
    Stream,
    first_bytes,
    first_record,
    open_stream,
    pipe,
)
from endpoint.link.upstream import Upstream
from endpoint.router.door import Refused
from endpoint.router.hedge import first_through
from endpoint.router.login import Want
from endpoint.router.router import Router

__all__ = ["carry"]

_TLS_ALERT = 0x15  # a TLS record of type alert: the server refused the handshake
_TLS_PORTS = frozenset({443, 8443})


async def carry(
    router: Router, want: Want, password: str, req: Request, client: Stream, ok: bytes
) -> None:
    """A tunnel for ``req`` opened, ``ok`` said to the client, then carried both ways;
    ``Refused`` (403, 503) when it cannot be opened, nothing said to the client. To an
    address on a TLS port, ``ok`` is said first: the client's ClientHello, which it sends
    only then, names the site (SNI) before an upstream is picked for it; when none can be
    opened then, the client sees the tunnel end."""
    cr, cw = client
    router.place(req)
    first = None
    named = req.port in _TLS_PORTS and _is_address(req.host)
    if named:
        if why := router.refused_destination(req.host):  # said before the tunnel is
            raise Refused(403, 2, why)
        cw.write(ok)
        first = await first_record(cr, router.answer_s)
        if name := server_name(first or b""):
            router.place(req, name)
            req.named = True
    try:
        up, (ur, uw) = await _open(router, want, password, req)
    except Refused:
        if not named:
            raise
        cw.close()
        return
    ends = _Ends([cw, uw])  # closed together when the login is revoked (router/door.py)
    router.door.hold((want.consumer, password), ends)
    try:
        if not named:
            cw.write(ok)
        router.outcomes.count("tunnel")
        router.outcomes.first_byte(req.read_at)
        # Only where the client speaks first (TLS): elsewhere the server may, and is
        # carried at once.
        if not named and req.site and req.port in _TLS_PORTS:
            first = await first_bytes(cr, router.answer_s)
        sent = 0  # upstreams the client's first bytes went to
        while first:
            uw.write(first)
            sent += 1
            reply = await first_bytes(ur, router.answer_s)
            if reply is None:  # nothing yet: no verdict, carried on
                break
            now = time.monotonic()
            if reply and reply[0] != _TLS_ALERT:
                if req.site:  # a ClientHello's name may make none
                    router.handshakes.got_through(req.site, now)
                cw.write(reply)
                break
            # A site named by the client alone (SNI) routes, and never teaches a block.
            if not req.named and router.handshakes.lately(req.site, now):
                router.charges.turned_away(want.consumer, up, req.site, now)
            else:
                router.outcomes.count("tls_refused_unread")
            if sent >= router.attempts:
                cw.write(reply)  # the site's own answer, as the last proxy got it
                cw.close()
                return
            uw.close()
            try:
                up, (ur, uw) = await _open(router, want, password, req)
            except Refused:
                cw.write(reply)  # the site's own answer, as it came
                cw.close()
                return
            ends.writers.append(uw)
        await pipe((cr, cw), (ur, uw))
    finally:
        router.door.release(ends)
        ends.close()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _open(router: Router, want: Want, password: str, req: Request) -> tuple[Upstream, Stream]:
    """A tunnel to the request's host through an upstream that can tunnel and was not
    tried for it, retried through others; 503 when nothing (more) matches; 403 for a
    destination not public."""
    if why := router.refused_destination(req.host):
        raise Refused(403, 2, why)
    started: dict[tuple[str, int], float] = {}

    def pick() -> Upstream | None:
        now = time.monotonic()
        exclude = req.tried | router.charges.left_out(want.consumer, req.site, now)
        up = router.pool.pick(want, tunnel=True, now=now, exclude=exclude, site=req.site)
        if up is not None:
            req.tried |= {up.key}
        return up

    async def connect(up: Upstream) -> Stream:
        started[up.key] = time.perf_counter()
        # Bounded by ``connect_s`` inside, where a silence after the CONNECT is told apart.
        return await open_stream(up, req.host, req.port, router.connect_s)

    def failed(up: Upstream, exc: BaseException) -> None:
        router.charges.not_opened(want, password, up, req.site, exc)

    through = await first_through(
        pick,
        connect,
        failed,
        lambda stream: stream[1].close(),
        attempts=router.attempts,
        connect_s=router.connect_s,
        hedging=router.hedging,
    )
    if through is None:
        router.outcomes.count("no_proxy")
        if req.tried:
            router.outcomes.count("no_proxy_after_tries")
        why = "no proxy in the pool matches" + (" and answers" if req.tried else "")
        raise Refused(503, 1, why)
    up, stream = through
    router.charges.worked(want, password, up, started[up.key])  # a tunnel is one outcome
    return up, stream


@dataclass(eq=False)
class _Ends:
    """A tunnel's two ends, closed together (``Door.hold``)."""

    writers: list[asyncio.StreamWriter]

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
