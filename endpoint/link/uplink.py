"""One connection to an upstream proxy for plain HTTP, and the idle ones kept for reuse.

An ``UpLink`` is an HTTP proxy's own connection (it is sent absolute URIs) or a SOCKS
tunnel to one site. It sends a client's request and reads the answer with httptools
(llhttp), writing it to the client as it comes: the head less its hop-by-hop fields,
the body as it was framed (a chunked body is chunked again, as httptools hands it over
de-chunked; an answer with neither length nor chunks ends with the connection, and so
does the client's). A HEAD's answer has no body whatever its length says; llhttp cannot
be told, so that link is not reused. Its ``Client`` (the router's ``Forwarding``) hears
what became of each request: ``answered``, ``unanswered`` (nothing came: the proxy's
failure, or a stale idle link's) or ``broken`` (it stopped midway).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol, cast

import httptools

from endpoint.link.request import Request
from endpoint.link.upstream import Upstream
from events.blockpages import SIGN_HEADERS

__all__ = ["CLOSED", "HOP", "Client", "Idle", "UpLink", "idle_key"]

# Why a link ended without an answer when its upstream closed it: a site's refusal may
# look so (endpoint/router/forwarding.py), a timeout never does.
CLOSED = "connection closed"

HOP = frozenset(
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


_READ = SIGN_HEADERS | {b"content-type", b"content-encoding"}


class Client(Protocol):
    """Whom a link answers (the router's ``Forwarding``, endpoint/router/forwarding.py):
    where the answer's bytes go, and what became of each request."""

    def write(self, data: bytes | bytearray, *, flush: bool = False) -> None: ...
    def head_passes(self, link: UpLink, status: int, location: str) -> bool: ...
    def page_passes(self, link: UpLink, whole: bytearray | None) -> bool: ...
    def answered(self, link: UpLink, reusable: bool) -> None: ...
    def broken(self, link: UpLink) -> None: ...
    def unanswered(self, link: UpLink, why: str) -> None: ...


class UpLink(asyncio.Protocol):
    """One connection to an upstream: an HTTP proxy (``forward``: it is sent absolute
    URIs) or a SOCKS tunnel to one site. Its answers are read with httptools and written
    to the client they are for as they come."""

    def __init__(self, up: Upstream, forward: bool, key: tuple[object, ...], answer_s: float):
        self.up, self.forward, self.key, self.answer_s = up, forward, key, answer_s
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.head_only = False  # a HEAD: the answer has no body, whatever it says
        self.http11 = True  # the client's HTTP version
        self.in_body = False  # its head went to the client
        self.chunked = False
        self.until_close = False  # no length, not chunked: its end is the connection's
        self.cut_client = False
        self.closed = False
        self.ended = ""  # why it ended before a request was sent on it (none: it did not)
        # What the site's verdict reads (events/sites.py): the answer's status, its
        # redirect, its body's size and, of an HTML page, its first ``capture`` bytes,
        # its Content-Encoding and the headers a block page is told by.
        self.status, self.location, self.size = 0, "", 0
        self.retry_after = b""  # a rate limit's Retry-After, as it came
        self.capture = 0
        self.seen = bytearray()
        self.html = False
        self.encoding = b""
        self.signs: list[tuple[str, str]] = []
        # An HTML answer of a site, held back (its head and first ``capture`` bytes)
        # until its page is read: a block page is tried elsewhere, never sent (None: not).
        self.held: bytearray | None = None
        self.said = ""  # its page's verdict, read once (the router's, as it read it)
        self.whole = True  # the answer had ended when its page was read (its size, whole)
        self.reused = False
        self.opened_at = time.monotonic()
        self.idle_since = 0.0
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None
        # A SOCKS4 link's transport came in python-socks' streams, whose writer closes
        # it when collected: held as long as the link is.
        self.writer: asyncio.StreamWriter | None = None
        self._lines: list[bytes] = []
        self._reason = b""
        self._framed = False
        self._keep = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def begin(self, client: Client, req: Request) -> None:
        """Send ``req`` and wait for its answer, ``answer_s`` at most for the head and
        between pieces of the body."""
        self.client = client
        if self.closed:  # it ended between its connect and this request: nothing was sent
            asyncio.get_running_loop().call_soon(self._fail, self.ended or CLOSED)
            return
        self.head_only = req.method == b"HEAD"
        self.http11 = req.http11
        self.in_body = self.chunked = self.until_close = self.cut_client = False
        self.status, self.location, self.size = 0, "", 0
        self.retry_after = b""
        self.seen.clear()
        self.html, self.encoding = False, b""
        self.signs.clear()
        self.held, self.said, self.whole = None, "", True
        self.last = time.monotonic()
        self.transport.write(req.head(self.forward) + req.body)
        if self.timer is None:  # one kept from an earlier request re-arms itself
            self.timer = asyncio.get_running_loop().call_later(self.answer_s, self._quiet_check)

    def _quiet_check(self) -> None:
        """Armed once for a run of requests on the link, not at each: it fires
        ``answer_s`` after it was armed, and waits on for what is left of that since
        the link last heard (or was sent) anything, while a request is on it."""
        self.timer = None
        if self.client is None or self.closed:
            return
        quiet = time.monotonic() - self.last
        if quiet < self.answer_s:
            self.timer = asyncio.get_running_loop().call_later(
                self.answer_s - quiet, self._quiet_check
            )
            return
        self._fail("no answer in time")

    def data_received(self, data: bytes) -> None:
        if self.client is None:  # bytes on an idle link: it cannot be trusted again
            self.ended = self.ended or "it spoke before it was asked"
            self.close()
            return
        self.last = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            raise  # ours, not the proxy's: asyncio logs it and closes the link
        except httptools.HttpParserError as exc:
            self._fail(f"a malformed answer: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.client is None:
            self.ended = self.ended or CLOSED
            return
        if self.until_close and self.in_body:  # the answer's end is this
            self._done(reusable=False)
        else:
            self._fail(CLOSED)

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self._lines, self._reason, self._framed = [], b"", False

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower in HOP:
            return
        if lower == b"content-length":
            self._framed = True
        elif lower == b"location":
            self.location = value.decode("latin-1")
        elif lower == b"retry-after":
            self.retry_after = value
        elif lower in _READ:  # what a page's verdict reads
            if lower == b"content-type":
                self.html = b"html" in value.lower()
            elif lower == b"content-encoding":
                self.encoding = value
            else:
                self.signs.append((lower.decode("latin-1"), value.decode("latin-1")))
        elif lower == b"transfer-encoding":  # said again below, as the client can take it
            self._framed = self.chunked = b"chunked" in value.lower()
            return
        self._lines.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        client = self.client
        assert client is not None
        status = self.parser.get_status_code()
        self._keep = self.parser.should_keep_alive()  # llhttp forgets it by the end
        head = b"HTTP/1.1 %d %s\r\n%s" % (status, self._reason, b"".join(self._lines))
        if status < 200:  # 1xx: passed on (not to HTTP/1.0); the answer follows
            if self.http11:
                client.write(head + b"\r\n")
            return
        self.status = status
        if not client.head_passes(self, status, self.location):  # turned away: tried again
            self.client = None
            if self.timer is not None:
                self.timer.cancel()
            self.close()
            return
        bodyless = self.head_only or status in (204, 304)
        self.until_close = not self._framed and not bodyless
        if self.chunked and not bodyless:
            if self.http11:
                head += b"Transfer-Encoding: chunked\r\n"
            else:  # an HTTP/1.0 client: the body as it is, and its end the connection's
                self.chunked = False
                self.cut_client = True
                head += b"Connection: close\r\n"
        if self.until_close:  # the client learns the end the same way
            head += b"Connection: close\r\n"
            self.cut_client = True
        if self.capture and self.html and not bodyless:
            self.held = bytearray(head + b"\r\n")  # its page is read first
        else:
            client.write(head + b"\r\n")
        self.in_body = True
        if self.head_only:  # llhttp would wait for the body its length announces
            self._done(reusable=False)

    def on_body(self, body: bytes) -> None:
        if self.client is None:
            return
        self.size += len(body)
        if self.html and len(self.seen) < self.capture:
            self.seen += body[: self.capture - len(self.seen)]
        # httptools hands the body de-chunked: chunked again as it goes.
        out = b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body
        if self.held is None:
            self.client.write(out)
        else:
            self.held += out
            if len(self.seen) >= self.capture:
                self._release(whole=False)

    def on_message_complete(self) -> None:
        if self.client is None or not self.in_body:
            return  # a 1xx ended, or an answer already done
        if self.chunked:
            if self.held is None:
                self.client.write(b"0\r\n\r\n")
            else:
                self.held += b"0\r\n\r\n"
        self._done(reusable=self._keep and not self.until_close)

    def _release(self, whole: bool) -> bool:
        """The held answer, its page read (``whole``: the answer has ended): to the
        client when it passes; else the link is let go (the client tries another proxy)
        and False."""
        held, self.held, client = self.held, None, self.client
        self.whole = whole
        assert held is not None and client is not None
        if client.page_passes(self, held if whole else None):
            client.write(held)
            return True
        self.client = None
        self.close()
        return False

    def _done(self, reusable: bool) -> None:
        if self.held is not None and not self._release(whole=True):
            return
        client, self.client = self.client, None
        if client is not None:
            client.answered(self, reusable and not self.closed)

    def _fail(self, why: str) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        if self.in_body and self.held is None:
            client.broken(self)
        else:  # nothing of it went to the client: as if none came
            self.held = None
            client.unanswered(self, why)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()


@dataclass
class Idle:
    """Idle links by (upstream, host, port) (``idle_key``): taken for the next request to
    that site through that upstream, given back after it."""

    per_key: int = 64
    max_idle_s: float = 20.0
    # A link is reused for this long after it opened, then a fresh one is made: an
    # upstream that died for new connections (a tarpit, a restart) would otherwise keep
    # serving through old ones, and the endpoint never learn it, nor tell the fleet.
    max_age_s: float = 3.0
    links: dict[tuple[object, ...], list[UpLink]] = field(default_factory=dict)

    def take(self, key: tuple[object, ...], now: float) -> UpLink | None:
        stack = self.links.get(key)
        while stack:
            link = stack.pop()
            fresh = (
                now - link.idle_since <= self.max_idle_s and now - link.opened_at <= self.max_age_s
            )
            if fresh and not link.closed and not link.transport.is_closing():
                link.reused = True
                return link
            link.close()
        return None

    def give(self, link: UpLink, now: float) -> None:
        stack = self.links.setdefault(link.key, [])
        if len(stack) >= self.per_key or now - link.opened_at > self.max_age_s:
            link.close()
            return
        link.idle_since = now
        stack.append(link)

    def close(self) -> None:
        for stack in self.links.values():
            for link in stack:
                link.close()
        self.links.clear()


def idle_key(up: Upstream, host: str, port: int) -> tuple[object, ...]:
    """A link carries one site's requests, whatever its upstream: a SOCKS tunnel goes to
    one site, and an HTTP proxy may too. tinyproxy, common among open proxies, reads an
    answer with an empty body as one without a length, and relays the connection on to
    its server for as long as that server keeps it open: a later request on it, for
    another site, would reach the first site with the client's headers
    (tests/test_forward.py)."""
    return (up.key, host, port)
