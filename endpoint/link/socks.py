"""A SOCKS5 upstream's handshake, driven from the connection's own callbacks: socksio
(sans-I/O) writes the greeting and the CONNECT and reads their replies; this module
carries the bytes and waits until a reply is whole, then hands the connection over.

python-socks' streams (SOCKS4 still goes through them, link/tunnel.py) pay a task
wake-up, a future and a stream's read for each reply: through a SOCKS5 upstream to a
site that closes after each answer, every request opens a link, and an open here costs
about half their CPU (BENCHMARKS.md, ``serve, a link a request``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import cast

from socksio import socks5

__all__ = ["Socks5Hello", "UpstreamRefused", "UpstreamSilent", "open_socks5", "reply_size"]

_NO_LOGIN = socks5.SOCKS5AuthMethod.NO_AUTH_REQUIRED
_GREETING = socks5.SOCKS5AuthMethodsRequest([_NO_LOGIN]).dumps()  # no login offered
_CONNECT = socks5.SOCKS5Command.CONNECT
_VERSION = b"\x05"
_SUCCEEDED = socks5.SOCKS5ReplyCode.SUCCEEDED.value
_NAMED = {code.value: code.name.lower().replace("_", " ") for code in socks5.SOCKS5ReplyCode}
# RFC 1928 §5: the bound address's length by its type (a name: its first byte says).
_ADDRESS_BYTES = {1: 4, 4: 16}


class UpstreamRefused(Exception):
    """The upstream would not open the way to the site, in its own words: a SOCKS
    reply's code, or an HTTP proxy's status to CONNECT (``code``)."""

    def __init__(self, why: str, code: int) -> None:
        super().__init__(why)
        self.code = code


class UpstreamSilent(Exception):
    """The upstream took the destination and said nothing of it: no reply to its CONNECT
    in time, or a close before one. The proxy's failure, or a destination that never
    answers it (one a consumer may name on purpose): the router tells them apart
    (router/charges.py ``failed_on_the_way``)."""


def reply_size(data: bytes) -> int | None:
    """How many bytes the CONNECT reply ``data`` begins is (RFC 1928 §6: four, the bound
    address by its type, two of port); None while not yet known. socksio reads a whole
    reply, and does not say how long one is."""
    if len(data) < 5:
        return None
    return 4 + _ADDRESS_BYTES.get(data[3], 1 + data[4]) + 2


class Socks5Hello(asyncio.Protocol):
    """A new connection to a SOCKS5 upstream until its CONNECT to ``host:port`` is
    granted (``opened`` set), or refused or broken (``opened``'s exception). What comes
    after the reply (a site that speaks first) is kept in ``rest``, and ``ended`` says
    the connection ended, for the protocol that takes it over. Two steps, each a
    message of socksio's: the greeting's reply, then the CONNECT's."""

    def __init__(self, host: str, port: int, opened: asyncio.Future[None]) -> None:
        self.host, self.port, self.opened = host, port, opened
        self.transport: asyncio.Transport | None = None
        self.greeted = False  # the greeting's reply came: the CONNECT went
        self.rest = b""
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(_GREETING)

    def data_received(self, data: bytes) -> None:
        self.rest += data
        if self.opened.done():
            return  # the site's first bytes, before the link takes the connection over
        try:
            self._read()
        except Exception as exc:  # a refusal, a reply not SOCKS5's, a name it cannot carry
            self.opened.set_exception(exc)

    def _read(self) -> None:
        got = self.rest
        if not self.greeted:
            if len(got) < 2:
                return
            if socks5.SOCKS5AuthReply.loads(got[:2]).method != _NO_LOGIN:
                raise ConnectionError("the SOCKS5 proxy asks for a login")
            self.greeted, self.rest = True, got[2:]
            got = self.rest
            assert self.transport is not None
            self.transport.write(_connect_request(self.host, self.port))
        if len(got) >= 2 and got[1:2] != _SUCCEEDED:
            if got[:1] != _VERSION:
                raise ConnectionError("the proxy's reply is not SOCKS5's")
            told = _NAMED.get(got[1:2])
            if told is None:  # a broken reply, the proxy's failure (as python-socks read it)
                raise ConnectionError(f"the SOCKS5 proxy's reply code {got[1]} is not RFC 1928's")
            # A refusal is told by its code: some proxies send no more of it, and close.
            raise UpstreamRefused(f"the SOCKS5 proxy refused: {told}", got[1])
        size = reply_size(got)
        if size is None or len(got) < size:
            return
        socks5.SOCKS5Reply.loads(got[:size])  # a malformed reply raises socksio's ProtocolError
        self.rest = got[size:]
        self.opened.set_result(None)

    def eof_received(self) -> bool:
        self.ended = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        if self.opened.done():
            return
        if self.greeted:  # the CONNECT went: reaching the site is what it gave up on
            why = f"the SOCKS5 proxy closed after its CONNECT, with no reply ({exc or 'EOF'})"
            self.opened.set_exception(UpstreamSilent(why))
        else:
            self.opened.set_exception(
                exc or ConnectionError("the SOCKS5 proxy closed the connection in its handshake")
            )


@functools.lru_cache(maxsize=4_096)
def _connect_request(host: str, port: int) -> bytes:
    """The CONNECT to ``host:port``, made once a destination: a site's requests open link
    after link to it. A name goes as python-socks sent it (IDNA), not as socksio would
    (UTF-8)."""
    return socks5.SOCKS5CommandRequest.from_address(_CONNECT, (host.encode("idna"), port)).dumps()


async def open_socks5(
    ip: str, port: int, host: str, host_port: int, within_s: float
) -> Socks5Hello:
    """A connection through the SOCKS5 proxy at ``ip:port`` to ``host:host_port`` (a
    name is resolved by the proxy), its handshake done within ``within_s``: the caller
    takes its transport over. No reply to the CONNECT in time is ``UpstreamSilent``."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[None] = loop.create_future()
    hello = Socks5Hello(host, host_port, opened)
    try:
        async with asyncio.timeout(within_s):
            transport, _ = await loop.create_connection(lambda: hello, ip, port)
            try:
                await opened
            except BaseException:
                transport.close()
                raise
    except TimeoutError:
        if hello.greeted:
            raise UpstreamSilent("the SOCKS5 proxy gave no reply to its CONNECT in time") from None
        raise
    return hello
