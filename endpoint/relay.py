"""The rotating proxy endpoint: HTTP forwarding, CONNECT and SOCKS5 on one port, each
request or tunnel carried by an upstream proxy from the live pool.

The first byte tells the protocol (5: SOCKS5, else HTTP, read by h11). Every client logs
in (HTTP ``Proxy-Authorization: Basic``, SOCKS5 user/password, RFC 1929) with its
consumer name, options (``endpoint/login.py``) and token; without a valid login it gets
407 (SOCKS: auth failure) and nothing else. A tunnel goes only through a proxy that can
tunnel; when nothing matches, 503 (SOCKS: general failure), never a direct connection.
An upstream that refuses, fails its handshake or stays silent is the proxy's failure:
avoided here at once, reported under the consumer's token, and the next upstream tried,
at most ``attempts`` times within ``connect_s`` each. A request already sent upstream is
sent again only when its method is idempotent and no byte came back. A target's own
answer (a 404, a 500) is the proxy working. Each consumer has at most
``max_per_consumer`` connections open.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11
import structlog
from python_socks import ProxyType
from python_socks.async_.asyncio import Proxy

from endpoint.choose import Pool, Upstream
from endpoint.forward import Idle, Link, relay_response, send_request
from endpoint.login import LoginError, Want, parse_login

__all__ = ["Endpoint", "Outcomes"]

log = structlog.get_logger("ppf.serve")

_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})
_MAX_BODY = 16 * 1024 * 1024
_TYPES = {"socks5": ProxyType.SOCKS5, "socks4": ProxyType.SOCKS4}
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Outcomes:
    """What the endpoint did, by outcome: for ``/metrics`` and ``ppf bench serve``."""

    counts: dict[str, int] = field(default_factory=dict)
    # Our own time from a request read to its sending upstream, the latest 1,000.
    added_ms: deque[float] = field(default_factory=lambda: deque(maxlen=1_000))

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1


class _Refused(Exception):
    """The client's request cannot be carried: (HTTP status, SOCKS reply code, why)."""

    def __init__(self, status: int, socks: int, why: str) -> None:
        super().__init__(why)
        self.status, self.socks = status, socks


@dataclass
class Endpoint:
    pool: Pool
    login_ok: Callable[[str, str], Awaitable[bool]]
    # Each outcome of a consumer's traffic (its token, its name, the upstream, worked,
    # latency ms, why it failed): the log's evidence, sent in rounds (endpoint/feed.py).
    record: Callable[[str, str, Upstream, bool, float, str], None] | None = None
    attempts: int = 3
    connect_s: float = 5.0
    answer_s: float = 30.0
    max_per_consumer: int = 64
    outcomes: Outcomes = field(default_factory=Outcomes)
    active: dict[str, int] = field(default_factory=dict)
    idle: Idle = field(default_factory=Idle)

    def close(self) -> None:
        """Close the idle upstream links (the server itself is its caller's to close)."""
        self.idle.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(1), 10)
            if first == b"\x05":
                await self._socks(reader, writer)
            elif first:
                await self._http(first, reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, h11.RemoteProtocolError):
            self.outcomes.count("client_error")
        finally:
            writer.close()

    # -- logins and limits ------------------------------------------------------------

    async def _login(self, user: str, password: str) -> Want | None:
        try:
            want = parse_login(user)
        except LoginError as exc:
            log.info("serve_login_refused", why=str(exc))
            return None
        return want if await self.login_ok(want.consumer, password) else None

    @contextlib.asynccontextmanager
    async def _slot(self, consumer: str):  # type: ignore[no-untyped-def]
        if self.active.get(consumer, 0) >= self.max_per_consumer:
            raise _Refused(429, 2, f"{consumer} has {self.max_per_consumer} connections open")
        self.active[consumer] = self.active.get(consumer, 0) + 1
        try:
            yield
        finally:
            self.active[consumer] -= 1

    # -- upstreams ----------------------------------------------------------------------

    async def _through(
        self, want: Want, password: str, host: str, port: int, *, tunnel: bool
    ) -> Link:
        """A connection through an upstream: a tunnel to ``host:port`` (SOCKS, CONNECT),
        or, for plain HTTP, an HTTP proxy itself (``Link.forward``: send it the absolute
        URI) or a SOCKS tunnel to the site, an idle one of an earlier request when there
        is one. Retried through others; 503 when nothing (more) matches."""
        tried: set[tuple[str, int]] = set()
        for _ in range(self.attempts):
            now = time.monotonic()
            up = self.pool.pick(want, tunnel=tunnel, now=now, exclude=frozenset(tried))
            if up is None:
                break
            tried.add(up.key)
            if not tunnel and (link := self.idle.take(_idle_key(up, host, port), now)):
                return link
            started = time.perf_counter()
            try:
                (reader, writer), forward = await asyncio.wait_for(
                    self._open(up, host, port, tunnel), self.connect_s
                )
            except Exception as exc:  # python-socks raises its own errors too: all the proxy's
                await self._failed(want, password, up, f"connect: {type(exc).__name__}: {exc}")
                continue
            if tunnel:  # a tunnel is one outcome; a request counts when answered
                self._worked(want, password, up, started)
            return Link(up, reader, writer, forward)
        self.outcomes.count("no_proxy")
        raise _Refused(503, 1, "no proxy in the pool matches" + (" and answers" if tried else ""))

    async def _open(self, up: Upstream, host: str, port: int, tunnel: bool) -> tuple[Stream, bool]:
        if up.proto in ("http", "https") and not tunnel:
            return await asyncio.open_connection(up.ip, up.port), True
        kind = _TYPES.get(up.proto, ProxyType.HTTP)
        proxy = Proxy.create(kind, up.ip, up.port, rdns=True)
        sock = await proxy.connect(host, port, timeout=self.connect_s)
        return await asyncio.open_connection(sock=sock), False

    async def _failed(self, want: Want, password: str, up: Upstream, why: str) -> None:
        self.pool.failed(up, time.monotonic())
        self.outcomes.count("upstream_failed")
        log.info("serve_upstream_failed", proxy=up.url(), why=why[:200])
        # The first failure in a row goes to the log; the next ones would only spend the
        # consumer's hourly budget of reports on what the checkers already have first.
        if self.record is not None and up.strikes == 1:
            self.record(password, want.consumer, up, False, 0.0, why)

    def _worked(self, want: Want, password: str, up: Upstream, started: float) -> None:
        ms = (time.perf_counter() - started) * 1000
        self.pool.worked(up, ms)
        if self.record is not None:
            self.record(password, want.consumer, up, True, ms, "")

    # -- SOCKS5 -------------------------------------------------------------------------

    async def _socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        want = await self._login(user, password)
        if want is None:
            self.outcomes.count("login_refused")
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
        try:
            async with self._slot(want.consumer):
                link = await self._through(want, password, host, port, tunnel=True)
                writer.write(b"\x05\x00\x00\x01" + bytes(6))
                self.outcomes.count("tunnel")
                await _pipe(reader, writer, link.reader, link.writer)
        except _Refused as exc:
            writer.write(bytes([5, exc.socks, 0, 1]) + bytes(6))

    # -- HTTP ---------------------------------------------------------------------------

    async def _http(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Requests one after another on the client's connection while HTTP keeps it
        open; a CONNECT turns it into a tunnel for good."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=65_536)
        conn.receive_data(first)
        request = await _next(conn, reader)
        if not isinstance(request, h11.Request):
            return
        want, password = await self._http_login(request)
        if want is None:
            self.outcomes.count("login_refused")
            _answer(
                writer,
                407,
                "a consumer login is required: NAME[-options]:TOKEN",
                [(b"Proxy-Authenticate", b'Basic realm="ppf"')],
            )
            return
        said = _authorization(request)
        try:
            async with self._slot(want.consumer):
                while True:
                    if request.method == b"CONNECT":
                        await self._connect(conn, request, want, password, reader, writer)
                        return
                    if not await self._forward(conn, request, want, password, reader, writer):
                        return
                    await writer.drain()
                    conn.start_next_cycle()
                    request = await _next(conn, reader)
                    if not isinstance(request, h11.Request):
                        return
                    if _authorization(request) != said:  # another login on the connection
                        want, password = await self._http_login(request)
                        said = _authorization(request)
                        if want is None:
                            self.outcomes.count("login_refused")
                            return
        except _Refused as exc:
            _answer(writer, exc.status, str(exc))
        except h11.ProtocolError:
            self.outcomes.count("client_error")

    async def _http_login(self, request: h11.Request) -> tuple[Want | None, str]:
        for name, value in request.headers:
            if name == b"proxy-authorization":
                scheme, _, encoded = value.partition(b" ")
                if scheme.lower() != b"basic":
                    break
                try:
                    user, _, password = base64.b64decode(encoded.strip()).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    break
                return await self._login(user, password), password
        return None, ""

    async def _connect(
        self,
        conn: h11.Connection,
        request: h11.Request,
        want: Want,
        password: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host, _, port = request.target.decode().rpartition(":")
        if not host or not port.isdigit():
            raise _Refused(400, 1, "CONNECT host:port")
        link = await self._through(want, password, host.strip("[]"), int(port), tunnel=True)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        early, _ = conn.trailing_data
        if early:
            link.writer.write(early)
        self.outcomes.count("tunnel")
        await _pipe(reader, writer, link.reader, link.writer)

    async def _forward(
        self,
        conn: h11.Connection,
        request: h11.Request,
        want: Want,
        password: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """One plain request through an upstream; True when the client's connection may
        carry the next one."""
        parsed = time.perf_counter()
        url = urlsplit(request.target.decode())
        if url.scheme != "http" or not url.hostname:
            raise _Refused(400, 1, "an absolute http:// URI (https goes through CONNECT)")
        body = b""
        while True:
            event = await _next(conn, reader)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:
                    raise _Refused(413, 1, f"bodies up to {_MAX_BODY} bytes")
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed) or event is None:
                break
        host, port = url.hostname, url.port or 80
        origin = ((url.path or "/") + (f"?{url.query}" if url.query else "")).encode()
        tries = self.attempts if request.method in _IDEMPOTENT else 1
        failures = 0
        while True:
            link = await self._through(want, password, host, port, tunnel=False)
            send_request(link, request, origin, body)
            self.outcomes.added_ms.append((time.perf_counter() - parsed) * 1000)
            done = await relay_response(link, conn, writer, self.answer_s)
            if done is None:
                link.close()
                if not link.reused:  # a stale idle link blames nobody: tried again, fresh
                    failures += 1
                    await self._failed(want, password, link.up, "request: no answer")
                if failures >= tries or (link.reused and request.method not in _IDEMPOTENT):
                    raise _Refused(502, 1, "the proxy took the request and gave no answer")
                continue
            self.outcomes.count("forwarded")
            self._worked(want, password, link.up, parsed)
            if done:
                self.idle.give(_idle_key(link.up, host, port), link, time.monotonic())
                return conn.our_state is h11.DONE and conn.their_state is h11.DONE
            link.close()
            return False


def _idle_key(up: Upstream, host: str, port: int) -> tuple[object, ...]:
    """An HTTP proxy carries any site on one connection; a SOCKS tunnel one site."""
    return (up.key,) if up.proto in ("http", "https") else (up.key, host, port)


def _authorization(request: h11.Request) -> bytes:
    return next((v for n, v in request.headers if n == b"proxy-authorization"), b"")


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The client's next h11 event; None once it closed, paused (after CONNECT) or
    stayed silent for 30 s (``asyncio.timeout``: wait_for costs a task a read)."""
    async with asyncio.timeout(30):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65_536)
                conn.receive_data(data)
                if not data:
                    return None
                continue
            if event is h11.PAUSED:
                return None
            return event


def _answer(
    writer: asyncio.StreamWriter,
    status: int,
    text: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = (text + "\n").encode()
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # h11 answers only a request
    conn.next_event()
    headers = [
        (b"Content-Type", b"text/plain"),
        (b"Content-Length", str(len(body)).encode()),
        (b"Connection", b"close"),
        *(extra or []),
    ]
    writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
    writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))


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


async def _pipe(
    cr: asyncio.StreamReader,
    cw: asyncio.StreamWriter,
    ur: asyncio.StreamReader,
    uw: asyncio.StreamWriter,
) -> None:
    """Both ways until both ends are done."""
    try:
        await asyncio.gather(_copy(cr, uw), _copy(ur, cw))
    finally:
        uw.close()


async def serve(endpoint: Endpoint, host: str, port: int) -> asyncio.Server:
    return await asyncio.start_server(
        endpoint.handle, host, port, family=socket.AF_INET6 if ":" in host else socket.AF_INET
    )
