"""The log as the projections and the gateway see it: a Protocol and its errors.

``eventlog/client.py`` implements it on JetStream; the live fold, the gateway and the
replay driver are written against this, so none of them imports ``ops/`` (the arrows
point inward) and a test can hand them any object with these methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from events import Event

__all__ = [
    "ConflictError",
    "DepositError",
    "DepositStore",
    "EventLog",
    "GapError",
    "LogError",
    "Message",
    "NatsUnreachable",
    "PublishError",
    "Published",
    "SnapshotError",
    "SnapshotStore",
    "Span",
]

Message = tuple[int, int, bytes, bytes]  # stream seq, server ts (unix ms), subject, payload


class LogError(RuntimeError):
    """Base of every error the log client raises."""


class NatsUnreachable(LogError):
    """No server of a NATS URL took a connection; ``why`` as a person says it
    (``Connection refused``, ``no connection in 5 s``; a reason a server for several)."""

    def __init__(self, shown: str, why: str) -> None:
        super().__init__(f"cannot connect to NATS at {shown}: {why}")
        self.why = why


class PublishError(LogError):
    """A publish that did not reach the stream after the bounded retries."""


class ConflictError(LogError):
    """A compare-and-set publish lost: the subject moved on (JetStream err_code 10071)."""


@dataclass(frozen=True, slots=True)
class Published:
    seq: int
    duplicate: bool


class EventLog(Protocol):
    """What the fold and the gateway need of the log."""

    address: str  # where it is, without credentials: for logs and status lines
    ops: dict[str, int]  # operations by kind, for /v1/stats

    async def head_seq(self) -> int: ...

    async def last_entry(self, subject: str, *, wait_s: float = ...) -> tuple[int, Event] | None:
        """The last event on ``subject`` and its sequence (a direct get), None when none."""
        ...

    async def subject_msgs(self, subject: str) -> int:
        """How many messages the log holds on ``subject``, from its index alone."""
        ...

    async def publish(
        self, event: Event, *, expected_last_subject_seq: int | None = None
    ) -> Published: ...

    async def publish_many(self, events: Sequence[Event]) -> list[int]: ...

    async def publish_acks(
        self, events: Sequence[Event], *, msg_id: Callable[[Event], str] = ...
    ) -> list[Published]: ...

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: dict[str, str] | None = None,
    ) -> Published: ...

    def read(self, start_seq: int, until: int | None = None) -> AsyncIterator[list[Message]]:
        """Batches of messages in stream order from ``start_seq``, forever or to ``until``."""
        ...


class DepositError(LogError):
    """A deposit that cannot be read as the log recorded it: ``reason`` says how
    (missing, digest, too-large, store)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class DepositStore(Protocol):
    """The deposit bucket (``ppf-deposits``), by key: only ``keys``, the daily reconcile's
    one pass behind a flag, lists it.
    ``ops``: operations by kind and outcome (``put.ok``, ``get.missing``, ...)."""

    ops: dict[str, int]

    async def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key``; returns its SHA-256 (hex), verified against what
        the store recorded. DepositError when it was not stored whole."""
        ...

    async def get(self, key: str, sha256: str) -> bytes:
        """The deposit under ``key``, only when its content has digest ``sha256``:
        DepositError (missing, digest) otherwise."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def keys(self) -> set[str]:
        """Every key: a list of the bucket, for the daily reconcile only."""
        ...


class GapError(LogError):
    """The log no longer holds the messages a fold must start from: trimmed behind a
    snapshot the fold did not start from."""


class SnapshotError(ValueError):
    """A snapshot that cannot be used: another format, damaged, not its own digest, or
    an object whose bytes are not what the store's meta says. A fold passes over it to
    an older one, or to the log."""


@dataclass(frozen=True, slots=True)
class Span:
    """What the stream holds now: its first and last sequence, its bytes, and the server
    time of its first message (0 when empty)."""

    first_seq: int
    last_seq: int
    bytes: int
    first_ts: int


class SnapshotStore(Protocol):
    """Where state snapshots are kept (``ppf-snapshots``), by sequence, and the stream
    they let trim."""

    async def put(self, seq: int, blob: bytes) -> None: ...

    async def seqs(self) -> list[int]:
        """The sequences of the snapshots kept, oldest first."""
        ...

    async def get(self, seq: int) -> bytes | bytearray:
        """The snapshot's bytes (a ``bytearray`` where that spares a copy)."""
        ...

    async def drop(self, seq: int) -> None: ...

    async def span(self) -> Span: ...

    async def trim(self, below: int) -> None:
        """Remove the stream's messages below sequence ``below``, and nothing else."""
        ...
