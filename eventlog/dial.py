"""Every nats-py connection ppf opens is dialled here: the log client's
(eventlog/client.py) and the gateway's callout and kicker (gateway/natsauth.py), which
may not import ops/.

nats-py keeps one transport for a client's life and, when a connection to a server is
made but its handshake fails (a node still starting, a callout not yet answering, a
listener that never sends INFO), dials the next server on that transport without
closing the socket it had: the old stream is dropped open and the garbage collector
finds it later (``ResourceWarning: unclosed <StreamWriter ...>``, seen in the cluster
test after a node's kill -9 and return). A client that closes what its transport holds
before it dials again keeps one socket, whatever the cluster does.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client, Srv
from nats.aio.transport import TcpTransport


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
