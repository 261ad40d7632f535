"""The JetStream log client: the log, its streams and its publishing (the connection is
eventlog/dial.py's).

Publishing rules:
- every publish carries ``Nats-Msg-Id`` = the event id, so a retried publish is stored
  once (the server answers ``duplicate=True`` with the original sequence);
- a compare-and-set publish (``Nats-Expected-Last-Subject-Sequence``) is always an
  awaited ``js.publish``: nats-py's ``publish_async`` never resolves when the server
  rejects a message;
- bulk publishing pipelines ``publish_async`` futures, each bounded by a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StoreCompression, StreamConfig

from eventlog.dial import NatsTls, connected, redact
from eventlog.objects import DepositBucket, SnapshotBucket
from eventlog.ordered import ordered_batches
from eventlog.protocol import ConflictError, LogError, Message, Published, PublishError
from eventlog.stream import Firehose
from eventlog.waiting import START_WAIT_S, until_answered
from eventlog.waiting import TRANSIENT as _TRANSIENT
from events import (
    DLQ_PREFIX,
    DLQ_STREAM,
    LOG_SUBJECTS,
    MAX_MESSAGE,
    STREAM,
    Event,
    decode,
    encode,
    subject_for,
)
from events.mint import fresh_id, now_ms

__all__ = [
    "ConflictError",
    "Log",
    "LogError",
    "NatsTls",
    "PublishError",
    "Published",
    "fresh_id",
    "now_ms",
    "redact",
]

log = structlog.get_logger("ppf.log")

_NO_PEERS = 10005  # "no suitable peers for placement": fewer nodes known than replicas


class _NoPeersYet(Exception):
    """A cluster's meta leader does not know enough of its peers yet (just started):
    a stream of N replicas cannot be placed for a moment."""


DUPLICATE_WINDOW_S = 300.0


DLQ_MAX_BYTES = 256 * 1024 * 1024  # the DLQ's entries, its oldest dropped past it
RETRIES = 3


def _own_id(event: Event) -> str:
    """The service's events go under their own ids: deterministic ones (a lookup's, a
    lease's) then deduplicate across every gateway and fold."""
    return event.id


def _cancelled_by_caller() -> bool:
    """Whether a CancelledError met here is this task's own cancellation (to go on up),
    rather than nats-py cancelling its own waits because the server went away."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _log_stream(replicas: int) -> StreamConfig:
    """The log's stream as ppf wants it."""
    return StreamConfig(
        name=STREAM,
        subjects=list(LOG_SUBJECTS),
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
        # Uncompressed: a reader that meets a block not in the server's cache (a fold
        # catching up, a replay) has it S2-decompressed while the store's lock is held,
        # and every publish waits behind it. It costs disk, four times S2's
        # (docs/decisions.md, The log). An existing stream is updated; its old blocks
        # stay compressed and still read.
        compression=StoreCompression.NONE,
        # No event comes near it: a larger message is junk, refused before it is stored
        # (the service's DLQ copies are cut at 16 KiB). A per-login payload limit in the
        # callout's user JWT does not apply in config mode (docs/decisions.md, The log):
        # the stream is where it holds.
        max_msg_size=MAX_MESSAGE,
        # 3 in a cluster (--replicas); an existing stream is moved to as many by the
        # update, and keeps its own where none is asked.
        num_replicas=replicas,
    )


def _dlq_stream(replicas: int) -> StreamConfig:
    """The DLQ, apart (a stream over ppf.> held it before: its subjects are narrowed
    first, so the two never overlap): bounded, its oldest entries dropped first, while
    the refused originals stay in the log at their sequences."""
    return StreamConfig(
        name=DLQ_STREAM,
        subjects=[f"{DLQ_PREFIX}>"],
        storage=StorageType.FILE,
        max_bytes=DLQ_MAX_BYTES,
        discard=DiscardPolicy.OLD,
        duplicate_window=DUPLICATE_WINDOW_S,
        max_msg_size=MAX_MESSAGE,
        num_replicas=replicas,
    )


async def _publish_async(
    js: JetStreamContext,
    events: list[Event],
    subject: Callable[[Event], str],
    msg_id: Callable[[Event], str],
    timeout: float,
) -> list[asyncio.Future[Any]]:
    """``events`` handed to nats-py's pipelined publish: the futures of their acks. Each
    hand-over is bounded by ``timeout`` too, as the acks are: nats-py's own waits (room
    for pending acks, its flusher) have no bound of theirs, and a fresh-clone run saw a
    worker stand still for minutes after a server restart with a publish its next step
    (the cause not found; a bounded publish fails into the outbox instead)."""
    futures = []
    for ev in events:
        try:
            async with asyncio.timeout(timeout):
                headers = {"Nats-Msg-Id": msg_id(ev)}
                future = await js.publish_async(subject(ev), encode(ev), headers=headers)
        except TimeoutError:
            raise PublishError(f"no room to publish within {timeout} s") from None
        except nats.errors.Error as exc:  # closed, or its buffer is full
            raise PublishError(f"cannot publish: {exc!r}") from exc
        except asyncio.CancelledError:
            # nats-py cancels its own flush when the server goes away: that is a lost
            # connection, not this task being cancelled.
            if _cancelled_by_caller():
                raise
            raise PublishError("the connection went away mid-publish") from None
        futures.append(future)
    return futures


async def _within(ack: asyncio.Future[Any], timeout: float) -> Any:
    """``ack``'s result within ``timeout`` (TimeoutError past it, ``ack`` cancelled)."""
    async with asyncio.timeout(timeout):
        return await ack


class Log:
    """A connection to the PPF stream (implements ``eventlog.protocol.EventLog``)."""

    def __init__(
        self, nc: Client, js: JetStreamContext, url: str, tls: NatsTls | None = None
    ) -> None:
        self.nc = nc
        self.js = js
        self.url = url
        self.tls = tls
        # Of the stream and the buckets it creates (ensure_stream); None: as they are.
        self.replicas: int | None = None
        self.address = redact(url)  # for logs: no password
        self._closing: list[bool] = []
        # NATS operations by kind, for /v1/stats; the deposit store counts its own.
        self.ops: dict[str, int] = dict.fromkeys(("publish", "direct_get", "stream_info"), 0)
        self.deposits = DepositBucket(js, self)
        self.snapshots = SnapshotBucket(nc, js, self)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str = "ppf",
        timeout: float = 5.0,
        inbox_prefix: str | None = None,
        tls: NatsTls | None = None,
        wait_s: float = 0.0,
    ) -> Log:
        """``url``: one URL or several, comma-separated (a cluster's: nats-py reconnects to
        another when one goes). ``inbox_prefix``: where replies come; an agent's NATS user
        may read only its own. ``tls``: the CA (and client certificate) for ``tls://``.
        ``wait_s``: how long a service starting beside its servers waits for one to
        accept a connection (0: a command fails at once, naming what it could not reach)."""
        tls = tls if tls is not None else NatsTls.from_env()
        nc, closing = await connected(url, name, timeout, inbox_prefix, tls, wait_s)
        client = cls(nc, nc.jetstream(timeout=timeout), url, tls)
        client._closing = closing
        return client

    async def close(self) -> None:
        self._closing.append(True)
        if self.nc.is_closed:
            return
        try:  # drain flushes what is pending; a server that went away gets a plain close
            async with asyncio.timeout(5):
                await self.nc.drain()
        except (TimeoutError, OSError, nats.errors.Error):
            await self._close_quietly()
        except asyncio.CancelledError:
            # nats-py cancels its own waits when the server is gone mid-drain: a lost
            # connection, not this task being cancelled (then it goes on up).
            if _cancelled_by_caller():
                raise
            await self._close_quietly()

    async def _close_quietly(self) -> None:
        try:
            async with asyncio.timeout(5):
                await self.nc.close()
        except (TimeoutError, OSError, nats.errors.Error) as exc:  # its socket is gone
            log.warning("nats_close_incomplete", url=redact(self.url), error=repr(exc))
        except asyncio.CancelledError:
            if _cancelled_by_caller():
                raise

    async def ensure_stream(self) -> None:
        """Create stream PPF, or bring its settings to ours; idempotent."""
        config = _log_stream(self.replicas or 1)
        dlq = _dlq_stream(config.num_replicas or 1)

        async def both() -> None:
            await self._add_or_update(config)
            if self.replicas is None:  # the log's own, as found
                dlq.num_replicas = (await self.js.stream_info(STREAM)).config.num_replicas
            await self._add_or_update(dlq)

        # A cluster still forming: no leader yet, or not all peers known.
        await until_answered(f"stream {STREAM}", both, transient=(*_TRANSIENT, _NoPeersYet))

    async def _add_or_update(self, config: StreamConfig) -> None:
        try:
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != 10058:  # 10058: exists with another config
                    raise
                if self.replicas is None:
                    info = await self.js.stream_info(STREAM)
                    config.num_replicas = info.config.num_replicas
                await self.js.update_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code == _NO_PEERS:  # a node of a new cluster not known yet
                raise _NoPeersYet(str(exc)) from exc
            raise LogError(f"cannot create stream {STREAM}: {exc}") from exc

    async def head_seq(self) -> int:
        self.ops["stream_info"] += 1
        info = await self.js.stream_info(STREAM)
        return int(info.state.last_seq)

    async def stored_bytes(self) -> tuple[int, int]:
        """(bytes the log's stream holds, bytes the deposit bucket holds): what the disk
        budget guard weighs (gateway/diskguard.py)."""
        self.ops["stream_info"] += 1
        info = await self.js.stream_info(STREAM)
        return int(info.state.bytes), await self.deposits.size()

    async def last_event(self, subject: str, *, wait_s: float = START_WAIT_S) -> Event | None:
        """The last event on ``subject`` (direct get), or None when there is none. A
        stream just made in a cluster answers direct gets only once its replicas have
        formed (NoResponders until then): asked again with backoff, said, for ``wait_s``."""
        entry = await self.last_entry(subject, wait_s=wait_s)
        return None if entry is None else entry[1]

    async def last_entry(
        self, subject: str, *, wait_s: float = START_WAIT_S
    ) -> tuple[int, Event] | None:
        """``last_event`` with its stream sequence."""

        async def ask() -> tuple[int, Event] | None:
            self.ops["direct_get"] += 1
            try:
                msg = await self.js.get_last_msg(STREAM, subject, direct=True)
            except nats.js.errors.NotFoundError:
                return None
            return int(msg.seq or 0), decode(msg.data or b"")

        return await until_answered(f"the last message on {subject}", ask, wait_s=wait_s)

    async def subject_msgs(self, subject: str) -> int:
        """How many messages the stream holds on ``subject``: from the server's index
        of subjects, with no block of the store read (gateway/lookahead.py)."""
        self.ops["stream_info"] += 1
        try:
            info = await self.js.stream_info(STREAM, subjects_filter=subject)
        except _TRANSIENT as exc:  # a node gone, a leader being elected
            raise LogError(f"{subject}: no stream info: {exc!r}") from exc
        return int((info.state.subjects or {}).get(subject, 0))

    async def publish(
        self, event: Event, *, expected_last_subject_seq: int | None = None
    ) -> Published:
        """Publish one event and await its ack, retrying transient failures."""
        return await self.publish_raw(
            subject_for(event),
            encode(event),
            msg_id=event.id,
            expected_last_subject_seq=expected_last_subject_seq,
        )

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: dict[str, str] | None = None,
        expected_last_subject_seq: int | None = None,
    ) -> Published:
        hdrs = {"Nats-Msg-Id": msg_id, **(headers or {})}
        if expected_last_subject_seq is not None:
            hdrs["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_subject_seq)
        delay = 0.2
        for attempt in range(1, RETRIES + 1):
            try:
                self.ops["publish"] += 1
                ack = await self.js.publish(subject, payload, headers=hdrs)
                return Published(seq=ack.seq, duplicate=bool(ack.duplicate))
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code in (10071, 10070):
                    raise ConflictError(str(exc)) from exc
                raise PublishError(f"{subject}: rejected: {exc}") from exc
            except _TRANSIENT as exc:  # a node gone, a leader being elected
                if attempt == RETRIES:
                    raise PublishError(f"{subject}: no ack after {attempt} tries") from exc
                log.warning("publish_retried", subject=subject, attempt=attempt, error=repr(exc))
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def publish_many(self, events: Sequence[Event], **how: Any) -> list[int]:
        """Pipelined publish of unguarded events; sequences in input order (``how``: as
        ``publish_acks`` takes it)."""
        return [a.seq for a in await self.publish_acks(events, **how)]

    async def publish_acks(
        self,
        events: Sequence[Event],
        *,
        window: int = 4000,
        timeout: float = 10.0,
        subject: Callable[[Event], str] = subject_for,
        msg_id: Callable[[Event], str] = _own_id,
    ) -> list[Published]:
        """Pipelined publish of unguarded events; their acks in input order, each saying
        whether the stream had that id already (``duplicate``: nothing was stored).
        ``subject`` and ``msg_id`` say where each goes and under which ``Nats-Msg-Id``:
        an agent publishes on its own subjects, under ids scoped by its name.

        Every future is bounded by ``timeout``; what did not get an ack is re-sent with
        the same ``Nats-Msg-Id`` (stored once), so a failure raises instead of dropping.
        A re-send's ack says duplicate when the first send was stored after all: the
        first ack's answer is the one kept.
        """
        acks: list[Published | None] = [None] * len(events)
        pending = list(range(len(events)))
        for attempt in range(1, RETRIES + 1):
            failed: list[int] = []
            for start in range(0, len(pending), window):
                chunk = pending[start : start + window]
                self.ops["publish"] += len(chunk)
                sending = [events[i] for i in chunk]
                futures = await _publish_async(self.js, sending, subject, msg_id, timeout)
                results = await asyncio.gather(
                    *(_within(f, timeout) for f in futures), return_exceptions=True
                )
                for i, res in zip(chunk, results, strict=True):
                    if isinstance(res, BaseException):
                        failed.append(i)
                    else:
                        # A re-send of ours found the first send stored: not a duplicate.
                        dup = bool(res.duplicate) and attempt == 1
                        acks[i] = Published(seq=res.seq, duplicate=dup)
            if not failed:
                return [a for a in acks if a is not None]
            log.warning("publish_many_retried", failed=len(failed), attempt=attempt)
            pending = failed
        raise PublishError(f"{len(pending)} of {len(events)} events got no ack")

    def read(self, start_seq: int, until: int | None = None) -> AsyncIterator[list[Message]]:
        """Batches in stream order: through the lean reader on its own connection, which
        dials each of the URLs in turn; over TLS, through nats-py's ordered consumer on
        this connection (eventlog/ordered.py: the lean reader speaks no TLS)."""
        if self.tls is not None or "tls://" in self.url:
            return ordered_batches(self.js, start_seq, until)
        return Firehose(self.url, start_seq).batches(until=until)
