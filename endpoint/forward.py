"""Plain HTTP through an upstream, kept alive at both ends, on asyncio protocols.

A scraper sends request after request on one connection to its proxy; each goes to an
upstream the strategy picks, on a connection kept from an earlier request to that
upstream when one is idle (``Idle``): an HTTP proxy's own connection (absolute URIs),
or a SOCKS tunnel to the same site. httptools (llhttp, Node.js's parser) reads both
sides: framing, chunked bodies, 1xx, keep-alive. The hot path (a request whose login the
connection already showed, an idle link to its upstream) runs in the protocols'
callbacks with no task and no stream between them, which is what keeps the endpoint's
own CPU a request a fraction of what streams cost (docs/decisions.md, The endpoint).
A new login, a new upstream connection, CONNECT and SOCKS take the slow path: CONNECT
and SOCKS hand the client's connection over to streams (``Endpoint.tunnel_http``,
``Endpoint.socks``) for good.

What refuses or says nothing is the proxy's failure (``Endpoint.failed``): avoided at
once, and the request tried through another while its method is idempotent; an idle
link that went stale is tried once more on a fresh one and blames nobody; a site that
turns a request away blames nobody either (endpoint/verdicts.py). A request is sent
upstream only once its body is whole (at most ``MAX_BODY``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import cast

import httptools

from endpoint.answers import answer, peer_address
from endpoint.choose import Upstream
from endpoint.deadlines import FIRST_BYTE_S, Deadlines
from endpoint.login import Want, challenge
from endpoint.serving import Serving
from endpoint.uplink import CLOSED, HOP, Request, UpLink, idle_key
from endpoint.verdicts import BLOCKED, head_verdict_of, learn, rule_of, wants_page

__all__ = ["MAX_BODY", "ClientSide"]

MAX_HEAD = 65_536
MAX_BODY = 16 * 1024 * 1024
_FLUSH = 65_536  # an answer goes to the client in writes of this size at least
LINGER_S = 2.0  # a refused connection whose body was coming is closed this much later
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})


class ClientSide(Deadlines, asyncio.Protocol):
    """One client connection: its requests read with httptools, one at a time through
    an upstream, answers relayed as they come."""

    def __init__(self, endpoint: Serving) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[Request] = deque()
        self.current: Request | None = None
        self.link: UpLink | None = None
        self.want: Want | None = None
        self.password = ""
        self.said = b""  # the Proxy-Authorization the connection logged in with
        self.login_at = 0.0  # when its login was last found good
        self.seen = False  # a first byte came
        self.closing = False
        self.out = bytearray()
        self.last = time.monotonic()
        # When the head being read began (None between heads): it must end within
        # ``Endpoint.head_s`` however slowly its bytes come, as the API's must.
        self.head_since: float | None = self.last
        # When a request's body began to be read, its login known (None: no body being
        # read): it must keep ``MIN_BODY_RATE`` after the head's time (``_idle_check``).
        self.body_since: float | None = None
        self.logging_in = False  # a login asked between a head and its body
        self.timer: asyncio.TimerHandle | None = None
        # The request being parsed.
        self._url = b""
        self._lines: list[bytes] = []
        self._head_size = 0
        self._auth = b""
        self._body: list[bytes] = []
        self._body_size = 0
        self._framed = False
        self._keep_alive = True
        self._http11 = True
        self._held: tuple[str, str] | None = None  # the login it is held under (revocation)

    # -- the client's bytes -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._arm(min(FIRST_BYTE_S, self.endpoint.head_s))

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # refused: what still comes is dropped unread
        self.last = time.monotonic()
        if not self.seen:
            self.seen = True
            if data[:1] == b"\x05":  # SOCKS5
                self._hand_over(data[1:], self.endpoint.socks)
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:  # CONNECT: a tunnel from here on
            if self.parser.get_method() != b"CONNECT":  # Upgrade: websocket and the like
                self._client_error(400, "protocol upgrades are not carried: use CONNECT")
                return
            self._tunnel(data[upgrade.args[0] :])
        except httptools.HttpParserCallbackError as exc:  # raised in one of ours below
            if not isinstance(exc.__context__, _TooLarge):
                raise
            self._client_error(exc.__context__.status, str(exc.__context__))
        except httptools.HttpParserError:
            self.endpoint.outcomes.count("client_error")
            self.close()

    def on_message_begin(self) -> None:
        if self.head_since is None:
            self.head_since = time.monotonic()
        self._url, self._lines, self._auth, self._body = b"", [], b"", []
        self._head_size = self._body_size = 0
        self._framed = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > MAX_HEAD:
            raise _TooLarge(431, f"request heads up to {MAX_HEAD} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            raise _TooLarge(431, f"request heads up to {MAX_HEAD} bytes")
        lower = name.lower()
        if lower == b"proxy-authorization":
            self._auth = value
        elif lower in (b"content-length", b"transfer-encoding"):
            # The body goes upstream whole, with its length (httptools de-chunks it).
            self._framed = True
            if lower == b"content-length" and value.strip().isdigit() and int(value) > MAX_BODY:
                raise _TooLarge(413, f"bodies up to {MAX_BODY} bytes")
        elif lower not in HOP:
            self._lines.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        self.head_since = None
        self._keep_alive = self.parser.should_keep_alive()
        self._http11 = self.parser.get_http_version() != "1.0"
        if not self._framed or self.current is not None or self.pending:
            return  # no body; or one behind a request in flight, whose login was known
        if self._login_known(self._auth):
            self.body_since = time.monotonic()
        elif self.transport is not None:
            # No byte of the body is read before its login is known: a stranger's body
            # costs one read of the socket, never the 16 MiB a body may have.
            self.logging_in = True
            self.transport.pause_reading()
            self._slow(self._login_before_body(self._auth))

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > MAX_BODY:
            raise _TooLarge(413, f"bodies up to {MAX_BODY} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.parser.get_method() == b"CONNECT":
            return  # feed_data raises HttpParserUpgrade next
        self.body_since = None
        body = b"".join(self._body)
        if body or self._framed:
            self._lines.append(b"Content-Length: %d\r\n" % len(body))
        self.pending.append(
            Request(
                method=self.parser.get_method(),
                target=self._url,
                host="",
                port=0,
                lines=b"".join(self._lines),
                body=body,
                keep_alive=self._keep_alive,
                authorization=self._auth,
                http11=self._http11,
            )
        )
        if self.current is None and not self.logging_in:
            self._next()
        elif self.transport is not None:
            self.transport.pause_reading()  # one in flight: the rest wait in the socket

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        if self.link is not None:  # the client went away mid-answer
            self.link.client = None
            self.link.close()
            self.link = None
        self.endpoint.leave(self.want)
        self.endpoint.release(self)
        self.want = None

    def pause_writing(self) -> None:
        if self.link is not None and not self.link.closed:
            self.link.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.link is not None and not self.link.closed:
            self.link.transport.resume_reading()

    # -- one request after another ------------------------------------------------------

    def _next(self) -> None:
        if self.closing or not self.pending:
            return
        req = self.current = self.pending.popleft()
        try:
            url = httptools.parse_url(req.target)
            if url.schema != b"http" or not url.host:
                raise ValueError("not an absolute http:// URI")
            req.host, req.port = url.host.decode("idna"), url.port or 80
            req.origin = (url.path or b"/") + (b"?" + url.query if url.query else b"")
            req.site = self.endpoint.site_of(req.host)
            req.rule = rule_of(self.endpoint.pool, req.site)
        except (httptools.HttpParserInvalidURLError, ValueError, UnicodeError):
            self._client_error(400, "an absolute http:// URI (https goes through CONNECT)")
            return
        if self._login_known(req.authorization):
            self.route(req)
        else:
            self._slow(self._login_then_route(req))

    def _login_known(self, authorization: bytes) -> bool:
        """Whether the connection showed this login, found good within the recheck time."""
        fresh = time.monotonic() - self.login_at < self.endpoint.login_recheck_s
        return self.want is not None and authorization == self.said and fresh

    async def _login_then_route(self, req: Request) -> None:
        if await self._log_in(req.authorization):
            self.route(req)

    async def _login_before_body(self, authorization: bytes) -> None:
        """A head that announced a body, its login asked before the body is read."""
        ok = await self._log_in(authorization)
        self.logging_in = False
        if not ok or self.closing:
            return
        self.body_since = time.monotonic()
        if self.current is None and self.pending:
            self._next()  # the body came whole with the head
        elif self.transport is not None:
            self.transport.resume_reading()

    async def _log_in(self, authorization: bytes) -> bool:
        """Check ``authorization`` and make it the connection's; refuse and close (407,
        429 past the consumer's connections) when it fails."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        want, password, why = await self.endpoint.http_login(authorization, peer_address(peer))
        if self.closing:
            return False
        if want is None:
            self.endpoint.outcomes.count("login_refused")
            self.refuse(407, why, challenge(why))
            return False
        if self.want is None or want.consumer != self.want.consumer:
            self.endpoint.leave(self.want)
            self.want = None
            if not self.endpoint.enter(want):
                self.endpoint.outcomes.count("over_limit")
                self.refuse(429, f"{want.consumer} has its connections open already")
                return False
        if (want.consumer, password) != self._held:
            self.endpoint.release(self)
            self.endpoint.hold((want.consumer, password), self)
            self._held = (want.consumer, password)
        self.want, self.password, self.said = want, password, authorization
        self.login_at = time.monotonic()
        return True

    def route(self, req: Request) -> None:
        """Through an idle link when the picked upstream has one; else a new one."""
        assert self.want is not None
        endpoint = self.endpoint
        if not req.tried and (why := endpoint.refused_destination(req.host)):
            self.refuse(403, why)
            return
        now = time.monotonic()
        if len(req.tried) >= endpoint.attempts:
            self._no_proxy(req)
            return
        up = endpoint.pool.pick(self.want, tunnel=False, now=now, exclude=req.tried, site=req.site)
        if up is None:
            self._no_proxy(req)
            return
        key = idle_key(up, req.host, req.port)
        link = None if req.fresh_only else endpoint.idle.take(key, now)
        if link is not None:
            self.send(req, link)
        else:
            self._slow(self._open_then_send(req, up, key))

    async def _open_then_send(self, req: Request, up: Upstream, key: tuple[object, ...]) -> None:
        want, password = self.want, self.password  # the client may be gone after the wait
        assert want is not None
        link = await self.endpoint.first_link(want, password, req, up, key)
        if self.closing:
            if link is not None:
                link.close()
        elif link is None:
            self._no_proxy(req)
        else:
            self.send(req, link)

    def send(self, req: Request, link: UpLink) -> None:
        self.link = link
        link.capture = wants_page(req.rule)
        link.begin(self, req)
        self.endpoint.outcomes.added_ms.append((time.perf_counter() - req.read_at) * 1000)

    # -- what the upstream answers (UpLink calls these) ---------------------------------

    def write(self, data: bytes | bytearray, *, flush: bool = False) -> None:
        self.out += data
        if (flush or len(self.out) >= _FLUSH) and self.transport is not None:
            self.transport.write(bytes(self.out))
            self.out.clear()

    def head_passes(self, link: UpLink, status: int, location: str) -> bool:
        """Whether an answer's head goes to the client: a site that turned the request
        away is not the proxy's failure, and an idempotent request is tried through
        another proxy while nothing of the answer went to the client."""
        req, endpoint = self.current, self.endpoint
        assert req is not None and self.want is not None
        site = req.site
        if not site or head_verdict_of(endpoint.pool, site, req.rule, status, location) != BLOCKED:
            return True
        endpoint.outcomes.count("turned_away")
        endpoint.pool.turned_away(link.up, req.site, time.monotonic())
        req.tried |= {link.up.key}
        if req.method not in _IDEMPOTENT or len(req.tried) >= endpoint.attempts:
            return True  # the client sees the site's answer
        self.link = None
        asyncio.get_running_loop().call_soon(self._again, req)
        return False

    def _again(self, req: Request) -> None:
        if not self.closing and self.current is req:
            self.route(req)

    def answered(self, link: UpLink, reusable: bool) -> None:
        """The whole answer went to the client."""
        req = self.current
        assert req is not None and self.want is not None
        self.link = None
        endpoint = self.endpoint
        endpoint.outcomes.count("forwarded")
        if req.site:
            learn(endpoint.pool, endpoint.outcomes, req.site, req.rule, link)
        endpoint.worked(self.want, self.password, link.up, req.read_at)
        if reusable:
            endpoint.idle.give(link, time.monotonic())
        else:
            link.close()
        self.write(b"", flush=True)
        self.current = None
        if not req.keep_alive or link.cut_client:
            self.close()
            return
        self.last = time.monotonic()
        if self.transport is not None:
            self.transport.resume_reading()
        self._next()

    def unanswered(self, link: UpLink, why: str) -> None:
        """Nothing came back: the proxy's failure (a stale idle link's, nobody's; the
        site's refusal when it is the only site that closed on the proxy lately), and
        the request tried again while that is safe."""
        req = self.current
        assert req is not None and self.want is not None
        self.link = None
        link.close()
        if self.closing:
            return
        if link.reused:
            if req.method not in _IDEMPOTENT:
                self.refuse(502, "the proxy took the request and gave no answer")
                return
            req.fresh_only = True
        else:
            req.tried |= {link.up.key}
            endpoint = self.endpoint
            closed = why == CLOSED and req.site
            if closed and endpoint.pool.closed_on(link.up, req.site, time.monotonic()):
                endpoint.outcomes.count("turned_away")  # the site's refusal, not the proxy's
            else:
                req.failures += 1
                endpoint.failed(self.want, self.password, link.up, f"request: {why}")
            if req.method not in _IDEMPOTENT or req.failures >= endpoint.attempts:
                self.refuse(502, "the proxy took the request and gave no answer")
                return
        self.route(req)

    def broken(self, link: UpLink) -> None:
        """The answer broke off midway: what came is sent, and the client's connection
        ends (it cannot tell where the answer stopped otherwise)."""
        self.link = None
        link.close()
        self.write(b"", flush=True)
        self.close()

    # -- endings --------------------------------------------------------------------------

    def _no_proxy(self, req: Request) -> None:
        self.endpoint.outcomes.count("no_proxy")
        tried = " and answers" if req.tried else ""
        self.refuse(503, f"no proxy in the pool matches{tried}")

    def _client_error(self, status: int, why: str) -> None:
        """A request the endpoint will not carry: counted (/metrics), answered, closed."""
        self.endpoint.outcomes.count("client_error")
        self.refuse(status, why)

    def refuse(self, status: int, why: str, extra: bytes = b"") -> None:
        transport = self.transport
        if transport is not None and not self.closing:
            transport.write(answer(status, why, extra))
            if self.logging_in and transport.can_write_eof():
                # Its body is still coming: closed now, the unread bytes would reset
                # the connection before the client reads the answer. The answer and our
                # end go first; what it sends meanwhile is dropped unread (``closing``),
                # and the connection closed LINGER_S later at most.
                self.closing = True
                transport.write_eof()
                transport.resume_reading()
                asyncio.get_running_loop().call_later(LINGER_S, self.close)
                return
        self.close()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()
        if self.link is not None:  # revoked mid-answer (Endpoint.hold)
            self.link.client = None
            self.link.close()
            self.link = None

    def _slow(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.endpoint.tasks.add(task)
        task.add_done_callback(self.endpoint.tasks.discard)

    def _hand_over(
        self,
        early: bytes,
        then: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        """The connection becomes a pair of streams, given to ``then``."""
        assert self.transport is not None
        self.closing = True  # this protocol is done with it
        self.endpoint.release(self)  # a tunnel holds its own login (Endpoint.tunnel_http)
        if self.timer is not None:
            self.timer.cancel()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=65_536)
        protocol = asyncio.StreamReaderProtocol(reader)
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        writer = asyncio.StreamWriter(self.transport, protocol, reader, loop)
        if early:
            reader.feed_data(early)
        self.transport.resume_reading()

        async def run() -> None:
            try:
                await then(reader, writer)
            finally:
                writer.close()

        self._slow(run())

    def _tunnel(self, early: bytes) -> None:
        if self.current is not None or self.pending:
            self._client_error(400, "CONNECT only on a connection with no request in flight")
            return
        target, auth, held = self._url, self._auth, self.want
        self.want = None  # the tunnel holds the connection's slot from here on

        async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.endpoint.tunnel_http(target, auth, held, reader, writer)

        self._hand_over(early, tunnel)


class _TooLarge(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
