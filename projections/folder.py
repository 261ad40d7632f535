"""Folds batches of raw log messages into a State, and checkpoints it to a Store.

Used alike by the live fold and by replay, so both build the same projection from the
same messages. Payloads are decoded here, once, at the edge of the core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path

from eventlog.protocol import Message
from events import DLQ_PREFIX, OBSERVATIONS, DecodeError, decode
from events.catalogue import ProxiesChecked
from projections.foreground import Foreground
from projections.store import Checkpoint, collect_async
from projections.writer import ProcessWriter
from reducers import State, skip
from reducers.admission import FORBIDDEN, refusal, refused_event
from reducers.fold import fold_single, folding

__all__ = ["Checkpointer", "Folder", "Message", "Rejected"]

Rejected = Callable[[int, bytes, bytes, DecodeError], None]

_DLQ = DLQ_PREFIX.encode()
_OBSERVED = frozenset(OBSERVATIONS)
# A round part-applied: its steps, and what its end needs (seq, ts, subject, payload,
# agent, refused results).
_Midway = tuple[
    Generator[None, None, bool], int, int, bytes, bytes, str, list[tuple[int, str, str]]
]


class Folder:
    """Applies messages in stream order; a bad payload is handed to ``on_reject``."""

    def __init__(self, state: State, on_reject: Rejected | None = None) -> None:
        self.state = state
        self.on_reject = on_reject
        self.applied = 0
        self.rejected = 0
        self.resent = 0
        self.last_ts = 0
        self._midway: _Midway | None = None

    def apply(self, batch: Iterable[Message]) -> int:
        """Fold every message of ``batch``; how many were applied."""
        before = self.applied
        self.apply_for(batch if isinstance(batch, list) else list(batch), 0, float("inf"))
        return self.applied - before

    def apply_for(self, messages: list[Message], start: int, seconds: float) -> int:
        """Fold ``messages[start:]`` until done or ``seconds`` have passed; the index to
        go on from. The live fold gives its event loop back between such slices, so
        queries answer however long the backlog is. A slice may end inside a round of
        results (``reducers.fold.folding``): ``midway`` is then true, the index is that
        round's, and the next call goes on with it (the same ``messages``)."""
        deadline = time.perf_counter() + seconds
        applied = 0
        i, n = start, len(messages)
        last_ts = 0
        while i < n:
            seq, ts, subject, payload = messages[i]
            if self._midway is not None:
                done = self._go_on(deadline)
            else:
                done = self._apply_one(seq, ts, subject, payload, deadline)
            if done is None:
                break  # midway through a round
            applied += done
            last_ts = ts
            i += 1
            if time.perf_counter() >= deadline:
                break
        if applied:
            self.last_ts = last_ts
        self.applied += applied
        return i

    @property
    def midway(self) -> bool:
        """Whether a round is part-applied: no checkpoint or snapshot may cut the state
        now, and nothing else may fold until ``apply_for`` or ``finish`` ends it."""
        return self._midway is not None

    def finish(self) -> None:
        """End a part-applied round at once (a stop: what is cut after is whole)."""
        if self._midway is not None:
            ts = self._midway[2]
            done = self._go_on(float("inf"))
            assert done is not None  # no deadline: it ran to its end
            self.applied += done
            self.last_ts = ts

    def _apply_one(
        self, seq: int, ts: int, subject: bytes, payload: bytes, deadline: float
    ) -> int | None:
        """One message: 1 when applied, 0 when skipped, rejected or a re-send; None
        when ``deadline`` came midway through it (``_go_on`` goes on)."""
        state = self.state
        if seq <= state.last_seq:
            return 0  # redelivered: applied already
        if subject.startswith(_DLQ):
            skip(state, seq, ts)  # kept in the log, never folded
            return 0
        try:
            event = decode(payload)
        except DecodeError as exc:
            self._reject(seq, ts, subject, payload, exc)
            return 0
        reason, why = refusal(state, subject, event, ts)  # reducers/admission.py
        if reason != FORBIDDEN and type(event) in _OBSERVED:  # its sender, not a forger's name
            state.skew[event.agent] = event.at - ts
        if reason:  # a forgery, nonsense, or a service bug: kept in the DLQ
            refused_event(state, event, reason, why)
            self._reject(seq, ts, subject, payload, DecodeError(reason, why))
            return 0
        agent = event.agent
        if type(event) is not ProxiesChecked:  # one step: no generator to drive
            single = fold_single(state, event, seq, ts)  # type: ignore[arg-type]
            return self._settle(single, seq, subject, payload, agent, ())
        refused: list[tuple[int, str, str]] = []
        steps = folding(state, event, seq, ts, refused)
        applied = _drive(steps, deadline)
        if applied is None:
            self._midway = (steps, seq, ts, subject, payload, agent, refused)
            return None
        return self._settle(applied, seq, subject, payload, agent, refused)

    def _go_on(self, deadline: float) -> int | None:
        """The round in hand, on until it is whole (then as ``_apply_one``) or the
        deadline has come (None)."""
        assert self._midway is not None
        steps, seq, _, subject, payload, agent, refused = self._midway
        try:
            applied = _drive(steps, deadline)
        except BaseException:
            self._midway = None  # a round whose rule raised is not gone on with
            raise
        if applied is None:
            return None
        self._midway = None
        return self._settle(applied, seq, subject, payload, agent, refused)

    def _settle(
        self,
        applied: bool,
        seq: int,
        subject: bytes,
        payload: bytes,
        agent: str,
        refused: Sequence[tuple[int, str, str]],
    ) -> int:
        for index, reason, why in refused:  # results of a round, each kept with its reason
            self.state.refusals[agent] = f"{reason}: {why}"
            self.rejected += 1
            if self.on_reject is not None:
                self.on_reject(seq, subject, payload, DecodeError(reason, why, index))
        if applied:
            return 1
        self.resent += 1  # an agent's re-send of what is folded already: counted, not applied
        return 0

    def _reject(self, seq: int, ts: int, subject: bytes, payload: bytes, exc: DecodeError) -> None:
        self.rejected += 1
        if self.on_reject is not None:
            self.on_reject(seq, subject, payload, exc)
        skip(self.state, seq, ts)


def _drive(steps: Generator[None, None, bool], deadline: float) -> bool | None:
    """A fold's steps until it returns (what it returns) or ``deadline`` (None)."""
    try:
        while True:
            next(steps)
            if time.perf_counter() >= deadline:
                return None
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class Checkpointer:
    """Writes checkpoints every ``every_events`` applied events or ``every_ms`` of wall time.

    Rows are encoded on the caller's thread (a consistent cut of the state) and written
    by a child process (``ProcessWriter``), so DuckDB never holds this process's GIL;
    the next checkpoint waits for the previous one, so they commit in order.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        every_events: int = 500_000,
        every_ms: int = 5_000,
        keep_digest: bool = True,
        foreground: Foreground | None = None,
    ) -> None:
        self.writer = ProcessWriter(path, keep_digest=keep_digest)
        self.foreground = foreground  # the cut yields to its requests between chunks
        self.every_events = every_events
        self.every_ms = every_ms
        self._inflight: asyncio.Task[int] | None = None
        self._whole: Checkpoint | None = None  # begin_with's, until it is handed on
        # One checkpoint at a time: the fold's batches and its idle timer both cut.
        self._lock = asyncio.Lock()
        self._since_seq = 0
        self._since_t = time.monotonic()
        self.written = 0
        self.rows = 0

    @property
    def last_written_seq(self) -> int:
        return self.writer.last_seq

    @property
    def digest(self) -> tuple[int, str]:
        """(sequence, digest of the projections at it) of the last committed checkpoint."""
        return self.writer.last_seq, self.writer.digest

    @property
    def digest_parts(self) -> dict[str, str]:
        """Each part of ``digest`` (``projections.digests``' names and form)."""
        return self.writer.parts

    async def start(self) -> int:
        """Start the writer; returns the last_seq committed in the file."""
        await self.writer.start()
        self._since_seq = self.writer.last_seq
        # every_ms counts from here: a state loaded for seconds before (a snapshot's)
        # was cut at the fold's first batch, as if a checkpoint were long overdue.
        self._since_t = time.monotonic()
        return self.writer.last_seq

    def due(self, state: State, held: Callable[[], bool] = lambda: False) -> bool:
        """Whether ``every_events`` were applied since the last checkpoint, or anything
        was and ``every_ms`` have passed, unless ``held`` (asked only then) says so."""
        if state.last_seq - self._since_seq >= self.every_events:
            return True
        elapsed = (time.monotonic() - self._since_t) * 1000
        return elapsed >= self.every_ms and state.last_seq > self._since_seq and not held()

    async def maybe(self, state: State, held: Callable[[], bool] = lambda: False) -> bool:
        if not self.due(state, held):
            return False
        await self.checkpoint(state)
        return True

    def begin_with(self, whole: Checkpoint) -> None:
        """Write ``whole`` (a snapshot's rows as it stores them: ``projections.snapshot``
        ``Loaded``) before the next checkpoint's cut, into a file the fold starts anew;
        the state's rows are not dirty for it."""
        self._whole = whole

    async def checkpoint(self, state: State) -> None:
        async with self._lock:
            whole, self._whole = self._whole, None
            if whole is not None:
                await self._hand(whole)
            cp = await collect_async(state, self.foreground)
            self._since_seq = state.last_seq
            self._since_t = time.monotonic()
            await self._hand(cp)

    async def _hand(self, cp: Checkpoint) -> None:
        """``cp`` to its write at once, behind the one in flight, whose wait is shielded:
        a fold cancelled here (a stop) cancelled the write it awaited and dropped the
        rows it had cut, and the stop's own flush then raised CancelledError (`ppf
        snapshot` failed so)."""
        self.written += 1
        self.rows += cp.rows
        previous = self._inflight
        self._inflight = asyncio.create_task(self._write_after(previous, cp))
        if previous is not None:  # at most one write waits: the fold's back-pressure
            await asyncio.shield(previous)

    async def _write_after(self, previous: asyncio.Task[int] | None, cp: Checkpoint) -> int:
        if previous is not None:
            await previous  # its failure is this one's too: checkpoints commit in order
        return await self.writer.write(cp)

    async def flush(self, state: State) -> None:
        """Checkpoint what is left and wait until it is committed."""
        await self.checkpoint(state)
        async with self._lock:
            if self._inflight is not None:
                await asyncio.shield(self._inflight)
                self._inflight = None

    async def close(self) -> None:
        if self._inflight is not None:
            await self._inflight
            self._inflight = None
        await self.writer.close()
