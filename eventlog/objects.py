"""The deposit store on a JetStream Object Store bucket, ``ppf-deposits``
(docs/architecture.md §2): raw pages, seed inputs and seed batches under keys minted from
the ledger (events/keys.py), read and deleted by key, never listed.

nats-py's object store checks a read against the digest the *writer* put in the
object's metadata; that writer may be anyone who could write the bucket, so every
read here is checked again against the digest the log recorded (``Deposited``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import msgspec
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, StorageType
from nats.js.object_store import ObjectStore

from eventlog.protocol import DepositError, LogError, SnapshotError, Span
from eventlog.stream import Firehose
from eventlog.waiting import START_WAIT_S, until_answered
from events.subjects import STREAM

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["BUCKET", "SNAPSHOTS", "DepositBucket", "SnapshotBucket"]

BUCKET = "ppf-deposits"
MAX_DEPOSIT = 64 * 1024 * 1024  # a seed input of a few million lines; pages are capped lower


class _Replicated(Protocol):
    replicas: int | None  # the log's: a bucket is made with as many
    url: str  # and where the lean reader dials


# An object's chunks come back to back; none for this long means the bucket lost some,
# or the read stalled (nats-py's ordered consumer does not restart on missed heartbeats):
# the reader would otherwise wait for them for ever, and a start or the ingest with it.
CHUNK_WAIT_S = 10.0


class _Stalled(Exception):
    """A read that got no chunk for ``CHUNK_WAIT_S``."""


class _Sink(io.BytesIO):
    """What nats-py writes an object's chunks into, counting them as they come."""

    chunks = 0

    def write(self, chunk: ReadableBuffer, /) -> int:
        self.chunks += 1
        return super().write(chunk)


async def _read_whole(store: ObjectStore, name: str) -> bytes:
    """An object's bytes through nats-py (its digest checked against the object's meta);
    ``_Stalled`` once no chunk has come for ``CHUNK_WAIT_S``. Its ``get`` without
    ``writeinto`` appends each chunk to a ``bytes`` (``result.data += msg.data``):
    quadratic (docs/decisions.md, The log); into a BytesIO, each chunk is copied once."""
    sink = _Sink()
    reading = asyncio.ensure_future(store.get(name, writeinto=sink))
    try:
        while True:
            came = sink.chunks
            done, _ = await asyncio.wait([reading], timeout=CHUNK_WAIT_S)
            if done:
                reading.result()  # its errors: not found, digest
                return sink.getvalue()
            if sink.chunks == came:
                raise _Stalled(f"{came} chunks came, then none for {CHUNK_WAIT_S:g} s")
    finally:
        # Stalled, or the caller stopped. Its subscription stays until the connection
        # closes (nats-py's get keeps it to itself): a read stalls seldom, and waiting
        # for ever on one held up everything behind it.
        reading.cancel()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _bucket(
    js: JetStreamContext, name: str, about: str, replicas: int, wait_s: float = START_WAIT_S
) -> ObjectStore:
    """The object store ``name``, made on first use; asked again while a cluster forms
    (for ``wait_s``: a request's first use waits less than a start)."""

    async def ask() -> ObjectStore:
        try:
            return await js.object_store(name)
        except nats.js.errors.BucketNotFoundError:
            return await js.create_object_store(
                name, storage=StorageType.FILE, description=about, replicas=replicas
            )

    return await until_answered(f"bucket {name}", ask, wait_s=wait_s)


class DepositBucket:
    """Implements ``eventlog.protocol.DepositStore``; the bucket is made on first use."""

    def __init__(self, js: JetStreamContext, log: _Replicated | None = None) -> None:
        self._js = js
        self._log = log
        self._store: ObjectStore | None = None
        self.ops: dict[str, int] = {}

    def _count(self, op: str, outcome: str) -> None:
        name = f"{op}.{outcome}"
        self.ops[name] = self.ops.get(name, 0) + 1

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            replicas = (self._log.replicas if self._log is not None else None) or 1
            self._store = await _bucket(self._js, BUCKET, "ppf deposits", replicas, wait_s=10)
        return self._store

    async def put(self, key: str, data: bytes) -> str:
        if len(data) > MAX_DEPOSIT:
            self._count("put", "too-large")
            raise DepositError("too-large", f"{len(data)} bytes > {MAX_DEPOSIT}")
        digest = _sha256(data)
        try:
            info = await (await self._bucket()).put(key, data)
        except (nats.errors.Error, OSError) as exc:
            self._count("put", "store")
            raise DepositError("store", repr(exc)) from exc
        stored = base64.urlsafe_b64decode((info.digest or "").removeprefix("SHA-256=")).hex()
        if stored != digest or info.size != len(data):
            self._count("put", "digest")
            raise DepositError("digest", f"stored {stored[:12]}, sent {digest[:12]}")
        self._count("put", "ok")
        return digest

    async def get(self, key: str, sha256: str) -> bytes:
        try:
            data = await _read_whole(await self._bucket(), key)
        except nats.js.errors.ObjectNotFoundError as exc:
            self._count("get", "missing")
            raise DepositError("missing", key) from exc
        except (nats.js.errors.DigestMismatchError, nats.js.errors.BadObjectMetaError) as exc:
            self._count("get", "digest")
            raise DepositError("digest", f"{key}: {type(exc).__name__}") from exc
        except _Stalled as exc:
            self._count("get", "store")
            raise DepositError("store", str(exc)) from exc
        except (nats.errors.Error, OSError) as exc:
            self._count("get", "store")
            raise DepositError("store", repr(exc)) from exc
        if _sha256(data) != sha256:
            self._count("get", "digest")
            raise DepositError("digest", f"{key} is not the content the log recorded")
        self._count("get", "ok")
        return data

    async def size(self) -> int:
        """Bytes the bucket's stream holds (stream info: not a list)."""
        try:
            status = await (await self._bucket()).status()
        except (nats.errors.Error, OSError):
            self._count("size", "store")
            raise
        self._count("size", "ok")
        return int(status.stream_info.state.bytes)

    async def keys(self) -> set[str]:
        """Every key in the bucket: a LIST, which only the daily reconcile makes (behind
        a flag, counted here as ``list``); nothing in steady state calls it."""
        try:
            infos = await (await self._bucket()).list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            infos = []  # an empty bucket
        except (nats.errors.Error, OSError) as exc:
            self._count("list", "store")
            raise DepositError("store", repr(exc)) from exc
        self._count("list", "ok")
        return {info.name for info in infos}

    async def delete(self, key: str) -> bool:
        try:
            await (await self._bucket()).delete(key)
        except nats.js.errors.ObjectNotFoundError:
            self._count("delete", "missing")
            return False
        self._count("delete", "ok")
        return True


SNAPSHOTS = "ppf-snapshots"
SNAPSHOT_CHUNK = 768 * 1024


class SnapshotBucket:
    """Implements ``eventlog.protocol.SnapshotStore`` on the ``ppf-snapshots`` bucket: one
    object a snapshot, named by its sequence. Only the service's login may write it
    (agents publish on their own subjects only: gateway/natsauth.py); what is read is
    checked again by its digest (projections/snapshot.py)."""

    def __init__(self, nc: Client, js: JetStreamContext, log: _Replicated | None = None) -> None:
        self._nc, self._js, self._log = nc, js, log
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            replicas = (self._log.replicas if self._log is not None else None) or 1
            self._store = await _bucket(self._js, SNAPSHOTS, "ppf state snapshots", replicas)
        return self._store

    async def put(self, seq: int, blob: bytes) -> None:
        # 768 KiB chunks, not nats-py's 128 KiB: each chunk of a snapshot of hundreds of
        # MB is a message to store and to read back (docs/decisions.md, The log); under a
        # default server's 1 MB max_payload still.
        meta = ObjectMeta(
            name=f"{seq:012d}", options=ObjectMetaOptions(max_chunk_size=SNAPSHOT_CHUNK)
        )
        await (await self._bucket()).put(f"{seq:012d}", blob, meta=meta)

    async def seqs(self) -> list[int]:
        try:
            infos = await (await self._bucket()).list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return []  # an empty bucket
        return sorted(int(info.name) for info in infos if info.name.isdigit())

    async def get(self, seq: int) -> bytes | bytearray:
        name = f"{seq:012d}"
        store = await self._bucket()
        url = self._log.url if self._log is not None else ""
        if not url or "tls://" in url or getattr(self._log, "tls", None) is not None:
            try:
                return await _read_whole(store, name)  # nats-py checks its digest
            except (nats.js.errors.DigestMismatchError, nats.js.errors.BadObjectMetaError) as e:
                raise SnapshotError(f"snapshot {name}: {type(e).__name__}") from e
            except _Stalled as e:
                raise SnapshotError(f"snapshot {name}: {e}") from e
        # The chunks through the lean reader (eventlog/stream.py): nats-py's parser was
        # the loaded gateway's longest wait (docs/decisions.md, Snapshots). Each chunk
        # is copied once, into a buffer of the object's size, and hashed as it comes
        # (joining a list of chunks faults in and copies every byte again).
        info = await store.get_info(name)
        if not info.chunks:  # nothing to read: the reader would wait for a first chunk
            return b""
        subject = f"$O.{SNAPSHOTS}.C.{info.nuid}"
        size, left = info.size or 0, info.chunks
        data, sha, at = bytearray(size), hashlib.sha256(), 0
        reader = Firehose(url, 1, stream=f"OBJ_{SNAPSHOTS}", filter_subject=subject)
        batches = reader.batches()
        try:
            while left:
                try:
                    async with asyncio.timeout(CHUNK_WAIT_S):
                        batch = await anext(batches)
                except TimeoutError:
                    got = info.chunks - left
                    raise SnapshotError(
                        f"snapshot {name}: {got} of its {info.chunks} chunks, then none for "
                        f"{CHUNK_WAIT_S:g} s"
                    ) from None
                for _, _, _, payload in batch[:left]:
                    if at + len(payload) > size:
                        raise SnapshotError(f"snapshot {name}: more than the object's {size} bytes")
                    data[at : at + len(payload)] = payload
                    sha.update(payload)
                    at += len(payload)
                left -= min(left, len(batch))
        finally:
            await batches.aclose()
        wanted = base64.urlsafe_b64decode((info.digest or "").removeprefix("SHA-256="))
        if at != size or sha.digest() != wanted:
            raise SnapshotError(f"snapshot {name}: {at} bytes not the object's {size}")
        return data

    async def drop(self, seq: int) -> None:
        with contextlib.suppress(nats.js.errors.ObjectNotFoundError):
            await (await self._bucket()).delete(f"{seq:012d}")

    async def span(self) -> Span:
        # The raw answer: nats-py's StreamState leaves out first_ts.
        reply = await self._nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=5)
        info = msgspec.json.decode(reply.data, type=_StreamInfo)
        if info.error is not None:
            raise LogError(f"stream info: {info.error}")
        st = info.state
        first_ts = 0
        if st.messages and st.first_ts and not st.first_ts.startswith("0001-"):
            first_ts = int(_parse_time(st.first_ts).timestamp() * 1000)
        return Span(st.first_seq, st.last_seq, st.bytes, first_ts)

    async def trim(self, below: int) -> None:
        await self._js.purge_stream(STREAM, seq=below)


class _State(msgspec.Struct):
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    first_ts: str = ""


class _StreamInfo(msgspec.Struct):
    state: _State = msgspec.field(default_factory=_State)
    error: dict[str, object] | None = None


def _parse_time(text: str) -> datetime:
    """RFC 3339 as nats-server writes it (nanoseconds: datetime takes six digits)."""
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
