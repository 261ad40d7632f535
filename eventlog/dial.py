"""Every nats-py connection ppf opens is dialled here: the log client's
(eventlog/client.py: ``connected``, after a probe that fails fast when no server
answers, with TLS where ``NatsTls`` asks for it) and the gateway's callout and kicker
(gateway/natsauth.py), which may not import ops/.

nats-py keeps one transport for a client's life and, when a connection to a server is
made but its handshake fails (a node still starting, a callout not yet answering, a
listener that never sends INFO), dials the next server on that transport without
closing the socket it had: the old stream is dropped open and the garbage collector
finds it later (``ResourceWarning: unclosed <StreamWriter ...>``, seen in the cluster
test after a node's kill -9 and return). A client that closes what its transport holds
before it dials again keeps one socket, whatever the cluster does.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import nats.errors
import structlog
from nats.aio.client import Client, Srv
from nats.aio.transport import TcpTransport

from eventlog.protocol import LogError, NatsUnreachable
from eventlog.waiting import until_answered

__all__ = ["NatsTls", "connected", "dial", "redact"]

log = structlog.get_logger("ppf.log")


class _OneSocket(Client):
    """nats-py's client, closing its transport's last connection before each dial."""

    async def _connect_to_server(self, s: Srv) -> None:
        if isinstance(self._transport, TcpTransport):
            # The TLS stream and the plain socket under it (the same one without TLS).
            for writer in (self._transport._io_writer, self._transport._bare_io_writer):
                if writer is not None:
                    writer.close()
        await super()._connect_to_server(s)


async def dial(servers: list[str], **options: Any) -> Client:
    """``nats.connect`` with a client that never leaves a socket open behind it."""
    nc = _OneSocket()
    await nc.connect(servers, **options)
    return nc


def redact(url: str) -> str:
    """``url`` without passwords: what logs and terminals may show."""
    out = []
    for one in url.split(","):
        parts = urlsplit(one.strip() if "://" in one else f"nats://{one.strip()}")
        host = parts.hostname or ""
        out.append(
            f"{parts.scheme}://{host}:{parts.port}" if parts.port else f"{parts.scheme}://{host}"
        )
    return ",".join(out)


async def _probe(url: str, timeout: float) -> None:
    """Fail fast when no server of ``url`` (comma-separated list) accepts a connection:
    each server's reason as a person says it (``Connection refused``)."""
    errors = []
    servers = url.split(",")
    for one in servers:
        parts = urlsplit(one.strip() if "://" in one else f"nats://{one.strip()}")
        try:
            async with asyncio.timeout(timeout):
                host, port = parts.hostname or "127.0.0.1", parts.port or 4222
                _, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            errors.append((one, f"no connection in {timeout:g} s"))
            continue
        except OSError as exc:
            errors.append((one, _said(exc)))
            continue
        writer.close()
        return
    why = errors[0][1] if len(servers) == 1 else "; ".join(f"{redact(u)}: {w}" for u, w in errors)
    raise NatsUnreachable(redact(url), why)


def _said(exc: OSError) -> str:
    """``Connection refused``, ``Name or service not known``: not asyncio's ``Connect
    call failed (...)`` nor the errno's number. A TLS failure says its own (its errno is
    the TLS library's, not the system's)."""
    if isinstance(exc, ssl.SSLError):
        return str(exc)
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return exc.strerror or repr(exc)
    return os.strerror(exc.errno)


@dataclass(frozen=True, slots=True)
class NatsTls:
    """TLS to NATS: the CA that signed the servers' certificates, and this client's own
    certificate and key where the servers ask for one (``verify: true``)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls) -> NatsTls | None:
        """``PPF_NATS_CA`` (and ``_CERT``, ``_KEY``), as ``--nats-ca`` sets them."""
        ca = os.environ.get("PPF_NATS_CA")
        if not ca:
            return None
        return cls(
            ca, os.environ.get("PPF_NATS_CERT") or None, os.environ.get("PPF_NATS_KEY") or None
        )

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


async def connected(
    url: str,
    name: str,
    timeout: float,
    inbox_prefix: str | None,
    tls: NatsTls | None,
    wait_s: float,
) -> tuple[Client, list[bool]]:
    """A nats-py connection for ``Log.connect`` (eventlog/client.py), and the flag its
    close sets (a disconnect then is expected, not warned of)."""
    shown = redact(url)

    async def error_cb(exc: Exception) -> None:
        log.warning("nats_error", url=shown, error=repr(exc))

    closing: list[bool] = []  # set by close(): a disconnect then is expected

    async def disconnected_cb() -> None:
        if not closing:
            log.warning("nats_disconnected", url=shown)

    async def reconnected_cb() -> None:
        log.info("nats_reconnected", url=shown)

    await until_answered(
        f"NATS at {shown}", lambda: _probe(url, timeout), wait_s=wait_s, transient=(LogError,)
    )
    try:
        # Reconnect forever once connected, but a first connect that fails is an
        # operator's error to report now, not to retry silently.
        async with asyncio.timeout(timeout):
            nc = await dial(
                [one.strip() for one in url.split(",") if one.strip()],
                name=name,
                **({"tls": tls.context()} if tls is not None else {}),
                connect_timeout=timeout,
                max_reconnect_attempts=-1,
                # Agents (their own inbox) wait longer than the service between
                # tries, so the gateway's callout is back before they ask it.
                reconnect_time_wait=1.0 if inbox_prefix else 0.5,
                allow_reconnect=True,
                pending_size=64 * 1024 * 1024,
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                **({"inbox_prefix": inbox_prefix} if inbox_prefix else {}),
            )
    except TimeoutError as exc:  # a server took the connection and said nothing
        raise NatsUnreachable(shown, f"no NATS answer in {timeout:g} s") from exc
    except OSError as exc:
        raise NatsUnreachable(shown, _said(exc)) from exc
    except nats.errors.Error as exc:  # it answered: a login refused, a protocol error
        raise LogError(f"cannot connect to NATS at {shown}: {exc!r}") from exc
    return nc, closing
