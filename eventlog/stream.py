"""A lean, in-order reader of the PPF stream, speaking the NATS protocol itself.

Why not nats-py here: its per-message parser and Msg objects cap an ordered consumer
at about 130-180k msg/s on this machine, and the fold needs that time
for itself. This reader opens its own connection, creates an ephemeral push consumer
(no acks, flow control answered by hand, idle heartbeats), and hands out batches of
``(stream_seq, server_ts_ms, subject, payload)`` parsed straight from the socket
buffer. The ack reply subject carries the sequence and server timestamp:
``$JS.ACK.<stream>.<consumer>.<delivered>.<stream_seq>.<consumer_seq>.<ts_ns>.<pending>``.

Gaps are never tolerated: a consumer sequence that skips means the server dropped
something for us, and the reader starts a new consumer right after the last stream
sequence it handed out (what nats-py's ordered consumer does).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import unquote, urlsplit

import structlog

from eventlog.protocol import Message
from events import STREAM

__all__ = ["Firehose", "FirehoseError", "Message", "native_frames"]

log = structlog.get_logger("ppf.firehose")


_CRLF = b"\r\n"
_READ = 1 << 20
# The socket is read into one buffer of this size, reused (grown only for a frame that
# does not fit): asyncio's StreamReader copied every read out of its own buffer into a
# new bytes object, and the reader joined each to the unparsed tail, two copies of
# every byte and a fresh megabyte (page faults) per read, a quarter of the reader's CPU.
_BUFFER = 4 * _READ
# The common frame: a data message with headers on sid 1 and a v1 ack reply. Runs of it
# are parsed by _frames.scan (eventlog/_frames.c) or its twin _scan_py; anything else
# (statuses, API replies, PING, other reply forms) takes the general path below.
_DATA = re.compile(
    rb"HMSG ([^ \r\n]+) 1 \$JS\.ACK\.[^. \r\n]+\.[^. \r\n]+\."
    rb"\d+\.(\d+)\.(\d+)\.(\d+)\.\d+ (\d+) (\d+)\r\n"
)
_MORE, _GAP, _UNTIL = 0, 1, 2  # why a run of common frames stopped


def _scan_py(
    data: bytes | bytearray,
    pos: int,
    expect: int,
    until: int,
    batch: list[Message],
    end: int = -1,
) -> tuple[int, int, int]:
    """Append the run of complete common frames at ``pos`` in ``data[:end]`` (all of it
    when ``end`` is -1) to ``batch``.

    Returns (pos, expect, status): where the run stopped, the consumer sequence
    expected next, and why (_MORE: another kind of frame or an incomplete one; _GAP: a
    consumer sequence other than ``expect``; _UNTIL: a stream sequence past ``until``,
    when it is not 0). The contract of eventlog/_frames.c, which the tests compare.
    """
    end = len(data) if end < 0 or end > len(data) else end
    fast = _DATA.match
    while pos < end:
        m = fast(data, pos, end)
        if m is None:
            return pos, expect, _MORE
        subject, sseq_b, cseq_b, ts_b, hlen_b, total_b = m.groups()
        start = m.end()
        total = int(total_b)
        hlen = int(hlen_b)
        if hlen > total or start + total + 2 > end:
            return pos, expect, _MORE
        cseq = int(cseq_b)
        if cseq != expect:
            return pos, expect, _GAP
        sseq = int(sseq_b)
        if until and sseq > until:
            return pos, expect, _UNTIL
        payload = bytes(data[start + hlen : start + total])
        batch.append((sseq, int(ts_b) // 1_000_000, subject, payload))  # groups are bytes
        expect = cseq + 1
        pos = start + total + 2
    return pos, expect, _MORE


try:
    from eventlog._frames import (  # type: ignore[import-not-found, unused-ignore]
        scan as _frames_scan,
    )
except ImportError:  # no C compiler at install time: the twin, slower
    _frames_scan = None
_scan = _frames_scan or _scan_py


def native_frames() -> bool:
    """Whether eventlog/_frames.c was built here (``ppf bench fold`` reports it)."""
    return _frames_scan is not None


class FirehoseError(RuntimeError):
    pass


class _Gap(Exception):
    pass


async def _connect(host: str, port: int) -> socket.socket:
    """A non-blocking TCP connection to the first of ``host``'s addresses that answers."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


class Firehose:
    """Iterate ``batches()`` from ``start_seq`` on, in stream order, forever or ``until``."""

    def __init__(
        self,
        url: str,
        start_seq: int = 1,
        *,
        heartbeat_s: float = 2.0,
        buffer_bytes: int = _BUFFER,
        stream: str = STREAM,
        filter_subject: str = "",
    ) -> None:
        # ``stream`` and ``filter_subject``: another stream read the same way (an
        # object's chunks: eventlog/objects.py reads a snapshot so).
        self.stream, self.filter_subject = stream, filter_subject
        # One URL or a cluster's several, comma-separated: each session dials the next
        # after one that failed.
        self._servers = []
        for one in url.split(","):
            parts = urlsplit(one.strip() if "://" in one else f"nats://{one.strip()}")
            login = (parts.username, parts.password)
            self._servers.append((parts.hostname or "127.0.0.1", parts.port or 4222, *login))
        self._at = 0
        self.host, self.port, self._user, self._password = self._servers[0]
        self.next_seq = max(start_seq, 1)
        self.heartbeat_s = heartbeat_s
        self.buffer_bytes = max(buffer_bytes, 16)  # grown for any frame that does not fit
        self._inbox = ""
        self._consumer = ""
        self._sock: socket.socket | None = None

    async def batches(self, until: int | None = None) -> AsyncGenerator[list[Message], None]:
        """Batches of messages; stops after ``until`` (a stream sequence) when given."""
        backoff = 0.2
        while until is None or self.next_seq <= until:
            try:
                async for batch in self._session(until):
                    backoff = 0.2
                    yield batch
                return
            except _Gap as gap:
                log.warning("firehose_gap", next_seq=self.next_seq, detail=str(gap))
            except (OSError, asyncio.IncompleteReadError, FirehoseError) as exc:
                log.warning("firehose_reconnecting", next_seq=self.next_seq, error=repr(exc))
                self._at = (self._at + 1) % len(self._servers)
                self.host, self.port, self._user, self._password = self._servers[self._at]
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                await self._close()

    async def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            if self._consumer:
                api = f"$JS.API.CONSUMER.DELETE.{self.stream}.{self._consumer}"
                self._consumer = ""
                async with asyncio.timeout(5):
                    await self._send(sock, f"PUB {api} 0\r\n\r\n".encode())
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()

    @staticmethod
    async def _send(sock: socket.socket, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(sock, data)

    async def _session(self, until: int | None) -> AsyncIterator[list[Message]]:
        loop = asyncio.get_running_loop()
        sock = self._sock = await _connect(self.host, self.port)
        buf = bytearray(self.buffer_bytes)
        filled = 0  # bytes of buf received and not yet parsed, from 0
        timeout = self.heartbeat_s * 5

        async def receive() -> None:
            """Append what the socket has to buf[filled:], growing buf for a frame that
            does not fit in it."""
            nonlocal filled
            if filled == len(buf):
                buf.extend(bytes(len(buf)))
            with memoryview(buf) as view:
                # At most _READ a time: batches stay ~2,500 messages, so the live fold
                # hands out what it folded often.
                into = view[filled : filled + _READ]
                async with asyncio.timeout(timeout):
                    n = await loop.sock_recv_into(sock, into)
            if not n:
                raise FirehoseError("connection closed by the server")
            filled += n

        while _CRLF not in buf[:filled]:
            await receive()
        eol = buf.index(_CRLF)
        if not buf.startswith(b"INFO"):
            raise FirehoseError(f"not a NATS server: {bytes(buf[:40])!r}")
        del buf[: eol + 2]
        buf.extend(bytes(eol + 2))
        filled -= eol + 2
        # A fresh inbox per session: a consumer of an earlier session lingers until its
        # inactive threshold, and must never find an interested subscriber again.
        self._inbox = f"_PPF.fh.{os.urandom(8).hex()}"
        connect: dict[str, object] = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "protocol": 1,
        }
        if self._user is not None:
            connect |= {"user": unquote(self._user), "pass": unquote(self._password or "")}
        config = {
            "stream_name": self.stream,
            "config": {
                **({"filter_subject": self.filter_subject} if self.filter_subject else {}),
                "deliver_subject": self._inbox,
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": self.next_seq,
                "ack_policy": "none",
                "replay_policy": "instant",
                "flow_control": True,
                "idle_heartbeat": int(self.heartbeat_s * 1e9),
                "inactive_threshold": int(30e9),
                "mem_storage": True,
                "num_replicas": 1,
            },
        }
        req = json.dumps(config).encode()
        api = f"$JS.API.CONSUMER.CREATE.{self.stream}"
        await self._send(
            sock,
            b"CONNECT "
            + json.dumps(connect).encode()
            + _CRLF
            + f"SUB {self._inbox} 1\r\nSUB {self._inbox}.api 2\r\n".encode()
            + f"PUB {api} {self._inbox}.api {len(req)}\r\n".encode()
            + req
            + _CRLF
            + b"PING\r\n",
        )
        expect_cseq = 1
        while True:
            await receive()
            data = buf
            batch: list[Message] = []
            pos = 0
            end = filled
            out: list[bytes] = []
            while pos < end:
                pos, expect_cseq, status = _scan(data, pos, expect_cseq, until or 0, batch, end)
                if batch:
                    self.next_seq = batch[-1][0] + 1
                if status == _GAP:
                    raise _Gap(
                        f"consumer seq expected {expect_cseq} at {bytes(data[pos : pos + 80])!r}"
                    )
                if status == _UNTIL:
                    if batch:
                        yield batch
                    return
                if pos >= end:
                    break
                eol = data.find(_CRLF, pos, end)
                if eol < 0:
                    break
                op = data[pos : pos + 4]
                if op == b"MSG " or op == b"HMSG":
                    parts = bytes(data[pos:eol]).split(b" ")
                    hmsg = op == b"HMSG"
                    total = int(parts[-1])
                    start = eol + 2
                    if start + total + 2 > end:
                        break
                    pos = start + total + 2
                    sid = parts[2]
                    if sid == b"2":
                        self._api_reply(bytes(data[start : start + total]))
                        continue
                    if len(parts) < (6 if hmsg else 5):  # no reply subject: a status
                        hdr = bytes(data[start : start + int(parts[-2])]) if hmsg else b""
                        self._status(hdr, None, out, expect_cseq)
                        continue
                    reply = parts[3]
                    if not reply.startswith(b"$JS.ACK."):
                        hdr = bytes(data[start : start + int(parts[-2])]) if hmsg else b""
                        self._status(hdr, reply, out, expect_cseq)
                        continue
                    tok = reply.split(b".")
                    if len(tok) == 9:
                        sseq, cseq, ts_ns = int(tok[5]), int(tok[6]), int(tok[7])
                    else:  # v2 reply with domain and account hash
                        sseq, cseq, ts_ns = int(tok[7]), int(tok[8]), int(tok[9])
                    if cseq != expect_cseq:
                        raise _Gap(f"consumer seq {cseq}, expected {expect_cseq}")
                    expect_cseq += 1
                    payload = bytes(
                        data[start + int(parts[-2]) : start + total]
                        if hmsg
                        else (data[start : start + total])
                    )
                    if until is not None and sseq > until:
                        if batch:
                            yield batch
                        return
                    self.next_seq = sseq + 1
                    batch.append((sseq, ts_ns // 1_000_000, parts[1], payload))
                else:
                    line = bytes(data[pos:eol])
                    pos = eol + 2
                    if line == b"PING":
                        out.append(b"PONG\r\n")
                    elif line.startswith(b"-ERR"):
                        raise FirehoseError(line.decode(errors="replace"))
            # The unparsed tail (a frame cut by the read) moves to the front.
            buf[: end - pos] = buf[pos:end]
            filled = end - pos
            if out:
                await self._send(sock, b"".join(out))
            if batch:
                yield batch
                if until is not None and self.next_seq > until:
                    return

    def _api_reply(self, body: bytes) -> None:
        reply = json.loads(body)
        if "error" in reply:
            raise FirehoseError(f"consumer create failed: {reply['error']}")
        self._consumer = reply.get("name", "")

    def _status(self, hdr: bytes, reply: bytes | None, out: list[bytes], expect: int) -> None:
        """Flow control requests get an empty reply; heartbeats reveal silent gaps."""
        if b"FlowControl" in hdr and reply:
            out.append(b"PUB " + reply + b" 0\r\n\r\n")
            return
        for line in hdr.split(_CRLF):
            name, _, value = line.partition(b":")
            if name == b"Nats-Last-Consumer" and int(value) >= expect:
                raise _Gap(f"heartbeat says consumer seq {int(value)} was sent")
            if name == b"Nats-Consumer-Stalled" and value.strip():
                out.append(b"PUB " + value.strip() + b" 0\r\n\r\n")
