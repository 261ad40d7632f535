"""A client connection: its bytes read on an asyncio protocol, kept alive.

A scraper sends request after request on one connection to its proxy. httptools
(llhttp, Node.js's parser) reads them: framing, chunked bodies, keep-alive; each, whole,
becomes a ``Request`` handed to the router (``router/forwarding.py``), one at a time,
and its answer written back as it comes. The first byte tells the protocol (5: SOCKS5,
else HTTP); CONNECT and SOCKS5 hand the connection over to streams for good
(``connection/tunnels.py``). The hot path runs in the protocols' callbacks with no task
and no stream between them, which is what keeps the endpoint's own CPU a request a
fraction of what streams cost (docs/decisions.md, The endpoint). A request is handed on
only once its body is whole (at most ``MAX_BODY``), and no byte of a body is read before
its login is known.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections import deque
from functools import partial
from typing import cast

import httptools

from endpoint.connection.answers import answer, peer_address
from endpoint.connection.deadlines import FIRST_BYTE_S, Deadlines
from endpoint.connection.tunnels import Carrier, connect_tunnel, hand_over, socks
from endpoint.link.request import Request
from endpoint.link.uplink import HOP
from endpoint.router.forwarding import Forwarding
from endpoint.router.router import Router

__all__ = ["MAX_BODY", "ClientSide", "serve"]

MAX_HEAD = 65_536
MAX_BODY = 16 * 1024 * 1024
_FLUSH = 65_536  # an answer goes to the client in writes of this size at least
LINGER_S = 2.0  # a refused connection whose body was coming is closed this much later


class ClientSide(Deadlines, asyncio.Protocol):
    """One client connection: its requests read with httptools and handed to the router
    one at a time, answers written back as they come (the router's ``Answering``)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.fw = Forwarding(router, self)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[Request] = deque()
        self.peer = ""  # the client's address
        self.seen = False  # a first byte came
        self.closing = False
        self.out = bytearray()
        self.last = time.monotonic()
        # When the head being read began (None between heads): it must end within
        # ``Router.head_s`` however slowly its bytes come, as the API's must.
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

    # -- the client's bytes -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.peer = peer_address(transport.get_extra_info("peername"))
        self._arm(min(FIRST_BYTE_S, self.router.head_s))

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # refused: what still comes is dropped unread
        self.last = time.monotonic()
        if not self.seen:
            self.seen = True
            if data[:1] == b"\x05":  # SOCKS5
                self._hand_over(data[1:], partial(socks, self.router))
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
            self.router.outcomes.count("client_error")
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
        if not self._framed or self.fw.current is not None or self.pending:
            return  # no body; or one behind a request in flight, whose login was known
        if self.fw.login_known(self._auth):
            self.body_since = time.monotonic()
        elif self.transport is not None:
            # No byte of the body is read before its login is known: a stranger's body
            # costs one read of the socket, never the 16 MiB a body may have.
            self.logging_in = True
            self.transport.pause_reading()
            self.router.spawn(self._login_before_body(self._auth))

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
        if self.fw.current is None and not self.logging_in:
            self._next()
        elif self.transport is not None:
            self.transport.pause_reading()  # one in flight: the rest wait in the socket

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        self.fw.ended()

    def pause_writing(self) -> None:
        link = self.fw.link
        if link is not None and not link.closed:
            link.transport.pause_reading()

    def resume_writing(self) -> None:
        link = self.fw.link
        if link is not None and not link.closed:
            link.transport.resume_reading()

    # -- one request after another ------------------------------------------------------

    def _next(self) -> None:
        if self.closing or not self.pending:
            return
        req = self.pending.popleft()
        try:
            url = httptools.parse_url(req.target)
            if url.schema != b"http" or not url.host:
                raise ValueError("not an absolute http:// URI")
            req.host, req.port = _host_of(url.host), url.port or 80
            req.origin = (url.path or b"/") + (b"?" + url.query if url.query else b"")
        except (httptools.HttpParserInvalidURLError, ValueError, UnicodeError):
            self._client_error(400, "an absolute http:// URI (https goes through CONNECT)")
            return
        self.fw.start(req)

    async def _login_before_body(self, authorization: bytes) -> None:
        """A head that announced a body, its login asked before the body is read."""
        ok = await self.fw.log_in(authorization)
        self.logging_in = False
        if not ok or self.closing:
            return
        self.body_since = time.monotonic()
        if self.fw.current is None and self.pending:
            self._next()  # the body came whole with the head
        elif self.transport is not None:
            self.transport.resume_reading()

    # -- what the router says (its Answering) -------------------------------------------

    def write(self, data: bytes | bytearray, *, flush: bool = False) -> None:
        self.out += data
        if (flush or len(self.out) >= _FLUSH) and self.transport is not None:
            self.transport.write(bytes(self.out))
            self.out.clear()

    def answered(self, keep_alive: bool) -> None:
        self.write(b"", flush=True)
        if not keep_alive:
            self.close()
            return
        self.last = time.monotonic()
        if self.transport is not None:
            self.transport.resume_reading()
        self._next()

    # -- endings --------------------------------------------------------------------------

    def _client_error(self, status: int, why: str) -> None:
        """A request the endpoint will not carry: counted (/metrics), answered, closed."""
        self.router.outcomes.count("client_error")
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
        self.fw.ended()  # revoked mid-answer (Door.hold): its link goes too

    def _hand_over(self, early: bytes, then: Carrier) -> None:
        """The connection becomes a pair of streams, given to ``then``."""
        assert self.transport is not None
        self.closing = True  # this protocol is done with it
        if self.timer is not None:
            self.timer.cancel()
        self.router.spawn(hand_over(self.transport, early, then))

    def _tunnel(self, early: bytes) -> None:
        if self.fw.current is not None or self.pending:
            self._client_error(400, "CONNECT only on a connection with no request in flight")
            return
        held = self.fw.hand_over()  # the tunnel holds the connection's slot from here on
        self._hand_over(early, partial(connect_tunnel, self.router, self._url, self._auth, held))


@functools.lru_cache(maxsize=8_192)
def _host_of(host: bytes) -> str:
    """A request's host as text (IDNA: ``xn--`` labels read back), read once a host."""
    return host.decode("idna")


class _TooLarge(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


async def serve(
    router: Router, host: str, port: int, *, reuse_port: bool = False
) -> asyncio.Server:
    """The endpoint listening on ``host:port``; ``reuse_port``: beside the other workers
    of one endpoint (ops/cli/workers.py)."""
    return await asyncio.get_running_loop().create_server(
        lambda: ClientSide(router),
        host,
        port,
        family=socket.AF_INET6 if ":" in host else socket.AF_INET,
        reuse_port=reuse_port or None,
    )
