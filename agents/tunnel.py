"""The ways through a proxy: a stream to it or through it (HTTP CONNECT, SOCKS4, SOCKS5
via python-socks), and TLS over a stream. What a check (``agents/check.py``) and the
HTTPS tunnel test (``agents/https.py``) both open."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from typing import Protocol

from python_socks import ProxyType
from python_socks.async_.asyncio import Proxy

__all__ = ["CONNECT_SHARE", "TUNNELS", "Stream", "Tls", "connect"]

TUNNELS = {"https": ProxyType.HTTP, "socks4": ProxyType.SOCKS4, "socks5": ProxyType.SOCKS5}


def _client_tls() -> ssl.SSLContext:
    """No chain verification: the judge's certificate is pinned instead (a lab or a
    private judge has no public chain, and what matters is whether it changed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


_TLS = _client_tls()


class Stream(Protocol):
    """What a check's request needs of a connection: a StreamReader/Writer pair, or TLS."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def read(self, n: int) -> bytes: ...


class Tls:
    """TLS over an open stream with memory BIOs, instead of asyncio's SSL transport.

    Why: asyncio's transport gives every connection a 256 KiB read buffer, thousands
    of checks at once (docs/decisions.md, Agents). Here OpenSSL's own buffers are all
    there is, and a check reads at most 64 KiB anyway."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hostname: str
    ) -> None:
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = _TLS.wrap_bio(self._incoming, self._outgoing, server_hostname=hostname)
        self._reader, self._writer = reader, writer

    async def _pump(self) -> None:
        """Send what TLS has to say, then feed it what the peer said."""
        await self.drain()
        data = await self._reader.read(16384)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def handshake(self) -> str:
        """Complete the handshake; the SHA-256 of the certificate the peer showed."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if self._incoming.eof:
                    raise ConnectionError("TLS: closed during the handshake") from None
                await self._pump()
        await self.drain()
        der = self._tls.getpeercert(binary_form=True)
        return hashlib.sha256(der).hexdigest() if der else ""

    def write(self, data: bytes) -> None:
        self._tls.write(data)

    async def drain(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def read(self, n: int) -> bytes:
        while True:
            try:
                return self._tls.read(n)
            except ssl.SSLWantReadError:
                if self._incoming.eof:
                    return b""
                await self._pump()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""


# A proxy that has not let us in (TCP, and its tunnel to the judge) within this share of
# the check's time is of no use; most dead candidates never answer a SYN, and this, not
# the whole timeout, is what each of them costs (3 s of the default 5).
CONNECT_SHARE = 0.6


async def connect(
    ip: str, port: int, proto: str, host: str, target_port: int, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the proxy (``http``) or through it to ``host:target_port`` (CONNECT,
    SOCKS).
    ``asyncio.timeout``, never ``wait_for``: on 3.11 a ``wait_for`` cancelled as its
    connection completes leaves it unclosed (a ResourceWarning at teardown)."""
    async with asyncio.timeout(timeout):
        if proto == "http":
            return await asyncio.open_connection(ip, port)
        sock = await Proxy(TUNNELS.get(proto, ProxyType.HTTP), ip, port).connect(host, target_port)
    try:
        return await asyncio.open_connection(sock=sock)
    except BaseException:  # a tunnel's socket that never became a stream
        sock.close()
        raise
