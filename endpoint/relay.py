"""The rotating proxy endpoint: HTTP forwarding, CONNECT and SOCKS5 on one port, each
request or tunnel carried by an upstream proxy from the live pool.

The first byte tells the protocol (5: SOCKS5, else HTTP). Plain HTTP is read and relayed
on asyncio protocols (``endpoint/forward.py``); CONNECT and SOCKS5 turn the connection
into a pair of streams piped to the upstream's tunnel (here). Every client logs in
(HTTP ``Proxy-Authorization: Basic``, SOCKS5 user/password, RFC 1929) with its consumer
name, options (``endpoint/login.py``) and token; without a valid login it gets 407
(SOCKS: auth failure) and nothing else. A tunnel goes only through a proxy that can
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
import contextlib
import functools
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from python_socks import ProxyError, ProxyType
from python_socks.async_.asyncio import Proxy

from endpoint.answers import answer, peer_address
from endpoint.choose import Pool, Upstream
from endpoint.door import Door, Refused
from endpoint.forward import ClientSide
from endpoint.hedge import Hedging, first_through
from endpoint.login import Want, challenge
from endpoint.serving import Outcomes
from endpoint.uplink import Idle, Request, UpLink, idle_key
from endpoint.verdicts import site_of
from events.address import ADDRESS_RULE
from events.hosts import rules_host
from events.validate import host_can_be_public

__all__ = ["Endpoint", "Outcomes"]

log = structlog.get_logger("ppf.serve")

_TYPES = {"socks5": ProxyType.SOCKS5, "socks4": ProxyType.SOCKS4}
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Endpoint:
    pool: Pool
    login_ok: Callable[[str, str], Awaitable[bool]]
    # Whether a login worked lately (asking nobody): such a login passes an address's
    # limit of failed logins, so a flood from one address refuses no consumer known there.
    login_known: Callable[[str, str], bool] = lambda name, token: False
    # Each outcome of a consumer's traffic (its token, its name, the upstream, worked,
    # latency ms, why it failed): the log's evidence, sent in rounds (endpoint/feed.py).
    record: Callable[[str, str, Upstream, bool, float, str], None] | None = None
    attempts: int = 3
    connect_s: float = 5.0
    answer_s: float = 30.0
    head_s: float = 10.0  # a client's request head is read whole within this, or closed
    # A connection's login is asked again (of the feed's cache) when it is this old.
    login_recheck_s: float = 5.0
    # Failed logins per client address: a burst, then one per period; past them a login
    # is refused without asking the gateway (as the gateway limits its own callers).
    login_failures_burst: int = 20
    login_failures_per_s: float = 1.0
    max_per_consumer: int = 64
    # Loopback, private and internal destinations carried (a lab's own origins); never
    # otherwise: through a proxy they reach that proxy host's metadata service or admin.
    lab: bool = False
    outcomes: Outcomes = field(default_factory=Outcomes)
    # Second upstreams started beside slow connects, at most this many at once (0: none).
    hedges: int = 64
    idle: Idle = field(default_factory=Idle)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # the slow paths running
    # Whether a login still holds, asked of the gateways once its answer is old (the
    # feed's ``login_still``); None: ``login_ok``. The connections open under each login
    # (keep-alive and tunnels) are closed within ``login_recheck_s`` of its revocation.
    login_still: Callable[[str, str], Awaitable[bool]] | None = None

    def __post_init__(self) -> None:
        self.hedging = Hedging(self.outcomes.count, self.hedges)
        self.door = Door(
            self.login_ok,
            self.login_known,
            self.login_still,
            self.outcomes,
            self.tasks,
            login_recheck_s=self.login_recheck_s,
            login_failures_burst=self.login_failures_burst,
            login_failures_per_s=self.login_failures_per_s,
            max_per_consumer=self.max_per_consumer,
        )
        # What a client connection asks of the door (endpoint/serving.py).
        door = self.door
        self.http_login, self.enter, self.leave = door.http_login, door.enter, door.leave
        self.hold, self.release = door.hold, door.release

    def close(self) -> None:
        """Close the idle upstream links and end the slow paths (the server itself is
        its caller's to close)."""
        self.idle.close()
        for task in self.tasks:
            task.cancel()

    def site_of(self, host: str) -> str:
        return site_of(host)

    def refused_destination(self, host: str) -> str:
        """Why ``host`` may not be a destination ("" when it may): the address rule
        (events/address.py) for an address in any notation, and internal names or names
        that spell a non-public address; other names are resolved by the upstream."""
        if self.lab or _may_reach(host):
            return ""
        self.outcomes.count("destination_refused")
        return f"destination {host[:100]!r} is not on the public internet"

    # -- upstreams ----------------------------------------------------------------------

    async def _tunnel(
        self, want: Want, password: str, host: str, port: int, tried: set[tuple[str, int]]
    ) -> tuple[Upstream, Stream]:
        """A tunnel to ``host:port`` through an upstream that can tunnel and is not in
        ``tried`` (which it joins), retried through others; 503 when nothing (more)
        matches; 403 for a destination not public. A proxy that answers but will not
        tunnel to the host (its own refusal, or the site's from its exit) was turned away
        by the site, not a failure of the proxy's."""
        if why := self.refused_destination(host):
            raise Refused(403, 2, why)
        site = self.site_of(host)
        started: dict[tuple[str, int], float] = {}

        def pick() -> Upstream | None:
            now = time.monotonic()
            up = self.pool.pick(want, tunnel=True, now=now, exclude=frozenset(tried), site=site)
            if up is not None:
                tried.add(up.key)
            return up

        async def connect(up: Upstream) -> Stream:
            started[up.key] = time.perf_counter()
            return await asyncio.wait_for(self._open(up, host, port), self.connect_s)

        def failed(up: Upstream, exc: BaseException) -> None:
            code = exc.error_code if isinstance(exc, ProxyError) else None
            if site and code is not None and code != 407:
                self.outcomes.count("turned_away")
                self.pool.turned_away(up, site, time.monotonic())
            else:  # python-socks raises its own errors too: all the proxy's
                self.failed(want, password, up, f"connect: {type(exc).__name__}: {exc}")

        through = await first_through(
            pick,
            connect,
            failed,
            lambda stream: stream[1].close(),
            attempts=self.attempts,
            connect_s=self.connect_s,
            hedging=self.hedging,
        )
        if through is None:
            self.outcomes.count("no_proxy")
            why = "no proxy in the pool matches" + (" and answers" if tried else "")
            raise Refused(503, 1, why)
        up, stream = through
        self.worked(want, password, up, started[up.key])  # a tunnel is one outcome
        return up, stream

    async def _open(self, up: Upstream, host: str, port: int) -> Stream:
        return await asyncio.open_connection(sock=await self._through(up, host, port))

    async def _through(self, up: Upstream, host: str, port: int) -> socket.socket:
        """A socket tunnelled by ``up`` (SOCKS, or an HTTP proxy's CONNECT) to the site."""
        proxy = Proxy.create(_TYPES.get(up.proto, ProxyType.HTTP), up.ip, up.port, rdns=True)
        sock: socket.socket = await proxy.connect(host, port, timeout=self.connect_s)
        return sock

    async def open_link(
        self, up: Upstream, host: str, port: int, key: tuple[object, ...]
    ) -> UpLink:
        """A new connection for plain HTTP: to an HTTP proxy itself (it is sent absolute
        URIs), or a SOCKS tunnel to the site; within ``connect_s``."""
        loop = asyncio.get_running_loop()
        forward = up.proto in ("http", "https")

        def made() -> UpLink:
            return UpLink(up, forward, key, self.answer_s)

        async with asyncio.timeout(self.connect_s):
            if forward:
                _, link = await loop.create_connection(made, up.ip, up.port)
            else:
                sock = await self._through(up, host, port)
                _, link = await loop.create_connection(made, sock=sock)
        return link

    async def first_link(
        self, want: Want, password: str, req: Request, up: Upstream, key: tuple[object, ...]
    ) -> UpLink | None:
        """A new link for ``req`` through ``up``, or through another upstream started
        beside it when its connect is slow (endpoint/hedge.py); None: none got through."""
        first, picked = [up], set[tuple[str, int]]()

        def pick() -> Upstream | None:
            exclude, now = req.tried | picked, time.monotonic()
            nxt = first.pop() if first else self.pool.pick(
                want, tunnel=False, now=now, exclude=exclude, site=req.site
            )  # fmt: skip
            picked.update([nxt.key] if nxt is not None else [])
            return nxt

        def connect(u: Upstream) -> Awaitable[UpLink]:
            linked = key if u is up else idle_key(u, req.host, req.port)
            return self.open_link(u, req.host, req.port, linked)

        def failed(u: Upstream, exc: BaseException) -> None:
            req.tried |= {u.key}  # python-socks raises its own errors too: all the proxy's
            self.failed(want, password, u, f"connect: {exc!r}")

        through = await first_through(
            pick, connect, failed, UpLink.close, attempts=self.attempts - len(req.tried),
            connect_s=self.connect_s, hedging=self.hedging,
        )  # fmt: skip
        return None if through is None else through[1]

    def failed(self, want: Want, password: str, up: Upstream, why: str) -> None:
        self.pool.failed(up, time.monotonic())
        self.outcomes.count("upstream_failed")
        log.info("serve_upstream_failed", proxy=up.url(), why=why[:200])
        # The first failure in a row goes to the log; the next ones would only spend the
        # consumer's hourly budget of reports on what the checkers already have first.
        if self.record is not None and up.strikes == 1:
            self.record(password, want.consumer, up, False, 0.0, why)

    def worked(self, want: Want, password: str, up: Upstream, started: float) -> None:
        ms = (time.perf_counter() - started) * 1000
        self.pool.worked(up, ms)
        if self.record is not None:
            self.record(password, want.consumer, up, True, ms, "")

    # -- SOCKS5 -------------------------------------------------------------------------

    async def socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A SOCKS5 client, its first byte (the version) read already."""
        try:
            await self._socks(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, UnicodeError):
            self.outcomes.count("client_error")

    async def _socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
            want, _ = await self.door.login(  # SOCKS5 says no more than "refused"
                user, password, peer_address(writer.get_extra_info("peername"))
            )
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
            async with self.door.slot(want):
                await self._carry(want, password, host, port, reader, writer, _SOCKS_OK)
        except Refused as exc:
            writer.write(bytes([5, exc.socks, 0, 1]) + bytes(6))

    async def _carry(
        self,
        want: Want,
        password: str,
        host: str,
        port: int,
        cr: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        ok: bytes,
    ) -> None:
        """A tunnel opened, its ``ok`` said to the client, then carried both ways. To a
        TLS port, the client's first bytes (its ClientHello) are kept until the site answers:
        a site that closes before its first byte, or answers with a TLS alert, turned
        this proxy's exit away, and the same bytes go through another proxy, the client
        none the wiser. The site's first byte says only that it let the exit in: its
        page, which may still be a block, is the client's to read, not ours."""
        tried: set[tuple[str, int]] = set()
        up, (ur, uw) = await self._tunnel(want, password, host, port, tried)
        ends = _Ends([cw, uw])  # closed together when the login is revoked (endpoint/door.py)
        self.hold((want.consumer, password), ends)
        try:
            cw.write(ok)
            self.outcomes.count("tunnel")
            site = self.site_of(host)
            # Only where the client speaks first (TLS): elsewhere the server may, and is
            # carried at once.
            first = await _first(cr, self.answer_s) if site and port in _TLS_PORTS else None
            while first:
                uw.write(first)
                reply = await _first(ur, self.answer_s)
                if reply is None:  # nothing yet: no verdict, carried on
                    break
                if reply and reply[0] != _TLS_ALERT:
                    cw.write(reply)
                    break
                self.outcomes.count("turned_away")
                self.pool.turned_away(up, site, time.monotonic())
                uw.close()
                try:
                    up, (ur, uw) = await self._tunnel(want, password, host, port, tried)
                except Refused:
                    cw.write(reply)  # the site's own answer, as it came
                    cw.close()
                    return
                ends.writers.append(uw)
            await _pipe(cr, cw, ur, uw)
        finally:
            self.release(ends)
            ends.close()

    # -- CONNECT ------------------------------------------------------------------------

    async def tunnel_http(
        self,
        target: bytes,
        authorization: bytes,
        held: Want | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A CONNECT, its head read (``endpoint/forward.py``); ``held``: the login the
        connection showed before, whose slot this now holds."""
        try:
            want, password, why = await self.http_login(
                authorization, peer_address(writer.get_extra_info("peername"))
            )
            if want is None:
                self.outcomes.count("login_refused")
                writer.write(answer(407, why, challenge(why)))
                return
            host, _, port = target.decode(errors="replace").rpartition(":")
            if not host or not port.isdigit():
                writer.write(answer(400, "CONNECT host:port"))
                return
            self.leave(held)
            held = None
            async with self.door.slot(want):
                host = host.strip("[]")
                await self._carry(want, password, host, int(port), reader, writer, _CONNECT_OK)
        except Refused as exc:
            writer.write(answer(exc.status, str(exc)))
        except (OSError, TimeoutError):
            self.outcomes.count("client_error")
        finally:
            self.leave(held)


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


@functools.lru_cache(maxsize=8_192)
def _may_reach(host: str) -> bool:
    """Whether ``host`` could be on the public internet, read as an upstream reads it
    (percent-decoded, IDNA), as the fold reads hosts; the same few hosts come again and
    again, so each is read once (its address parsed, its spelling looked at)."""
    read, unreadable = rules_host(host)
    return not unreadable and host_can_be_public(read, rule=ADDRESS_RULE)


@dataclass(eq=False)
class _Ends:
    """A tunnel's two ends, closed together (``Endpoint.hold``)."""

    writers: list[asyncio.StreamWriter]

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


_SOCKS_OK = b"\x05\x00\x00\x01" + bytes(6)
_CONNECT_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"
_TLS_ALERT = 0x15  # a TLS record of type alert: the server refused the handshake
_TLS_PORTS = frozenset({443, 8443})


async def _first(reader: asyncio.StreamReader, within_s: float) -> bytes | None:
    """The first bytes ``reader`` gives (b"": it closed, or was reset, first); None when
    none came within ``within_s`` (nothing is read then)."""
    try:
        async with asyncio.timeout(within_s):
            return await reader.read(65_536)
    except TimeoutError:
        return None
    except OSError:
        return b""


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


async def serve(
    endpoint: Endpoint, host: str, port: int, *, reuse_port: bool = False
) -> asyncio.Server:
    """The endpoint listening on ``host:port``; ``reuse_port``: beside the other workers
    of one endpoint (ops/cli/workers.py)."""
    return await asyncio.get_running_loop().create_server(
        lambda: ClientSide(endpoint),
        host,
        port,
        family=socket.AF_INET6 if ":" in host else socket.AF_INET,
        reuse_port=reuse_port or None,
    )
