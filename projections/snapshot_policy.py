"""When state snapshots are taken, which are kept, how far the log is trimmed behind
them, and how a fold starts from one (the format: ``projections/snapshot.py``).

A fold starts from the newest snapshot it can read when that is ahead of its own
checkpoint (a new gateway: from the snapshot, not from sequence 1), and refuses to
start on a gap: when the log no longer holds the message after its state, it says
which snapshot it would need. The fold that writes snapshots (``SnapshotPolicy``) takes
one every ``every_messages`` messages or ``every_s`` seconds of folding, or early once
the stream has grown by ``every_bytes`` since the last (byte pressure: large messages,
refused input, that a count of messages would let pile up), keeps the
newest ``keep``, and with ``trim``, once it keeps that many, purges the stream below the
oldest: history goes only where a snapshot covers it, and ``keep - 1`` intervals of it
stay behind the newest.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from eventlog.protocol import GapError, SnapshotStore, Span
from projections.foreground import drive
from projections.rowsums import RowSums
from projections.snapshot import Loaded, SnapshotError, opened, taking
from reducers import State

__all__ = ["SnapshotPolicy", "Snapshots"]

log = structlog.get_logger("ppf.snapshots")
STEP_S = 0.004  # the loop is given back this often while a snapshot is encoded


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    every_messages: int = 1_000_000
    every_s: float = 600.0
    every_bytes: int = 1 << 30
    keep: int = 3
    trim: bool = False


class Snapshots:
    """The snapshots of one fold: ``store`` where they are kept, ``policy`` None for a
    fold that only starts from them (a gateway replica)."""

    def __init__(self, store: SnapshotStore, policy: SnapshotPolicy | None = None) -> None:
        self.store = store
        self.policy = policy
        self.kept: list[int] = []  # sequences, oldest first, as last listed
        self.span: Span | None = None  # the stream, as last read
        self.taken = 0
        self._last = (0, time.monotonic())  # (messages applied, when) at the last one
        self._last_bytes: int | None = None  # the stream's bytes then (None: not read yet)

    async def refresh(self) -> None:
        self.kept = await self.store.seqs()
        self.span = await self.store.span()

    async def start_from(self, state: State) -> Loaded | None:
        """The newest readable snapshot ahead of ``state``, opened (None: ``state`` is as
        far, or none is readable). GapError when neither it nor ``state`` reaches the
        stream's first message."""
        await self.refresh()
        assert self.span is not None
        loaded = None
        for seq in reversed(self.kept):
            if seq <= state.last_seq:
                break
            sums = RowSums()  # its interpreter starts while the snapshot is fetched
            try:
                blob = await self.store.get(seq)
                loaded = await asyncio.to_thread(opened, blob, sums)
            except (SnapshotError, OSError) as exc:
                log.warning("snapshot_unreadable", seq=seq, error=str(exc))
                continue
            finally:
                sums.close()  # ended already by a load; not when the fetch failed
            log.info("snapshot_loaded", seq=seq, proxies=len(loaded.state.proxies))
            break
        at = loaded.state.last_seq if loaded is not None else state.last_seq
        first = self.span.first_seq  # of an empty, trimmed stream: its last + 1
        if first > at + 1:
            raise GapError(
                f"the log starts at seq {first}, after this fold's seq {at}: messages "
                f"{at + 1}-{first - 1} were trimmed and no readable snapshot covers them "
                f"(snapshots kept: {self.kept or 'none'})"
            )
        return loaded

    def due(self, applied: int) -> bool:
        p = self.policy
        if p is None:
            return False
        messages, at = self._last
        if self.span is not None and self._last_bytes is None:
            self._last_bytes = self.span.bytes  # the first reading: what the fold met
        grown = self.span.bytes - (self._last_bytes or 0) if self.span is not None else 0
        return (
            applied - messages >= p.every_messages
            or (applied > messages and time.monotonic() - at >= p.every_s)
            or (applied > messages and p.every_bytes > 0 and grown >= p.every_bytes)
        )

    async def encode(self, state: State) -> bytes:
        """The snapshot of ``state`` now; the caller keeps the fold still meanwhile."""
        blob, _ = await drive(taking(state), STEP_S)
        return blob

    async def keep(self, seq: int, blob: bytes, applied: int) -> None:
        """Store a snapshot encoded at ``seq``, then drop the ones past ``keep`` and trim
        the stream behind the oldest kept (with ``trim``)."""
        await self.store.put(seq, blob)
        self.taken += 1
        self._last = (applied, time.monotonic())
        log.info("snapshot_taken", seq=seq, bytes=len(blob))
        keep = self.policy.keep if self.policy is not None else 0
        self.kept = await self.store.seqs()
        if keep:
            for old in self.kept[:-keep]:
                await self.store.drop(old)
            self.kept = self.kept[-keep:]
        if self.policy is not None and self.policy.trim and len(self.kept) >= max(keep, 1):
            span = await self.store.span()
            if span.first_seq <= self.kept[0]:
                await self.store.trim(self.kept[0] + 1)
                log.info("log_trimmed", below=self.kept[0] + 1, was_first=span.first_seq)
        self.span = await self.store.span()
        self._last_bytes = self.span.bytes
