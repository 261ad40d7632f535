"""The live fold: follows the stream, keeps the projections in memory, checkpoints them.

It restores from its DuckDB file (when it has one), resumes at ``last_seq + 1``, and
sends every message that fails to decode to ``ppf.dlq.<reason>`` with its reason and
original sequence: kept, never folded, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from eventlog.protocol import DepositStore, EventLog, GapError
from projections.deadletters import DeadLetters
from projections.folder import Checkpointer, Folder, Message
from projections.foreground import Foreground
from projections.rates import PipelineStats
from projections.snapshot import Loaded
from projections.snapshot_policy import Snapshots
from projections.store import Store
from projections.tasks import stop_tasks
from projections.writer import MEMORY
from reducers import State

__all__ = ["LAG_BOUND", "SLICE_S", "FoldService", "Sink", "far_behind", "metrics_row"]

log = structlog.get_logger("ppf.fold")

HEAD_EVERY_S = 0.25  # how often the stream's head is read, for queries to find it read
# The longest the fold holds the event loop at a time (projections/folder.py apply_for).
SLICE_S = 0.002
# Messages behind the log's head within which a fold counts as caught up: /readyz says
# 200 within it (the gateway's default ``lag_bound``), and the locator works within it.
LAG_BOUND = 1_000


async def far_behind(fold: FoldService) -> bool:
    """Whether more than ``LAG_BOUND`` messages are left for ``fold`` to apply, by the
    head as last read (every 250 ms): no NATS round trip of its own, so it neither waits
    nor fails while NATS is away or a cluster elects (the reading is then old, and says
    less). The lease granter and the locator hold back while it is so."""
    return fold.catching_up()


class Sink(Protocol):
    """Where folded batches go besides the projections (the Axiom tap, ``ops/telemetry``)."""

    @property
    def stats(self) -> Any: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def feed(self, batch: list[Message]) -> None: ...

    def metrics(self, row: dict[str, object]) -> None: ...


class SeqWaiters:
    """Waiters for a sequence, in a heap: each batch wakes only those it satisfied (a
    Condition's notify_all woke every waiting request on every batch)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    async def wait(self, seq: int, timeout: float) -> bool:
        """Wait until ``wake`` is told ``seq`` or later; False on timeout."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (seq, next(self._ids), fut))
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        return True

    def wake(self, applied: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= applied:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)


class FoldService:
    """One projection replica. ``db`` None keeps it in memory only (a gateway replica):
    its checkpoint writer then keeps the digest alone (``projections/writer.py``)."""

    def __init__(
        self,
        log_client: EventLog,
        *,
        db: str | Path | None = None,
        dlq: bool = True,
        every_events: int = 500_000,
        every_ms: int = 5_000,
        tap: Sink | None = None,
        deposits: DepositStore | None = None,
        between: Callable[[], None] = lambda: None,
        snapshots: Snapshots | None = None,
    ) -> None:
        self.log = log_client
        self.snapshots = snapshots  # starts from them; takes them when it has a policy
        self._db = Path(db) if db is not None else None
        self.deposits = deposits  # its operations go into the tap's metrics row
        self.state = State()
        if db is not None:
            store = Store(db)  # restore here; the checkpoint writer owns the file after
            try:
                self.state = store.restore()
            finally:
                store.close()
        # The requests answered on this loop (the gateway's middleware counts them):
        # between slices the fold and its checkpoint's cut wait for them a little, and
        # ``between``, the process's collector policy (ops/cli passes ops/collector.py's
        # young collection; nothing by default), runs between any two steps of work
        # that yields to them.
        self.foreground = Foreground(between)
        self.checkpointer = Checkpointer(
            db if db is not None else MEMORY,
            every_events=every_events,
            every_ms=every_ms,
            foreground=self.foreground,
        )
        # Without a DLQ to write (a gateway beside the fold that writes it), refusals are
        # still counted per agent: the cut-off (gateway/penalty.py) is every gateway's.
        self.dead_letters = DeadLetters(log_client, lambda: self.state.last_seq, write=dlq)
        self.folder = Folder(self.state, self.dead_letters.refused)
        self.tap = tap
        self.stats = PipelineStats()
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters = SeqWaiters()
        self._cut = asyncio.Lock()
        self._head = (0.0, 0)
        self._whole_after = 0  # the head when a snapshot was adopted (_maybe_checkpoint)
        # What a timed checkpoint waits for, asked of the state: the gateway's pool view
        # being built or due (gateway/views.py), which users wait on; nobody waits on a cut.
        self.cut_waits_for: Callable[[State], bool] = lambda state: False
        log.info("fold_restored", last_seq=self.state.last_seq, db=str(db) if db else None)

    @property
    def running(self) -> bool:
        """False once the fold task died (the gateway reports it on /healthz)."""
        return bool(self._tasks) and not self._tasks[0].done()

    @property
    def applied_seq(self) -> int:
        return self.state.last_seq

    def catching_up(self) -> bool:
        """Whether more than ``LAG_BOUND`` messages are left to apply, by the head as
        last read (``far_behind``'s reading, without a wait)."""
        return self._head[1] - self.state.last_seq > LAG_BOUND

    def digest(self) -> tuple[int, str]:
        """(digest_seq, digest): the projections' digest at the last checkpoint, kept by
        the checkpoint writer; never computed on this loop (a million rows take seconds)."""
        return self.checkpointer.digest

    async def checkpoint_now(self) -> tuple[int, str]:
        """Checkpoint what is applied and wait for it: the digest at ``applied_seq``."""
        async with self._cut:
            await self.checkpointer.flush(self.state)
        return self.checkpointer.digest

    async def head_seq(self, max_age_s: float = 5.0) -> int:
        """The stream's last sequence, as ``_watch_head`` last read it (every 250 ms): a
        query must not wait for a JetStream API round trip, which takes tens of ms on a
        server busy ingesting and, now and then, more than a second (it was all of
        /v1/stats' p99 at a million proxies). Read here only when no read succeeded for
        ``max_age_s`` (not started yet, or NATS away: then the caller sees the error)."""
        at, seq = self._head
        if time.monotonic() - at > max_age_s:
            seq = await self._read_head()
        # A cached head may predate what the fold has applied since: never report less.
        return max(seq, self.state.last_seq)

    async def _read_head(self) -> int:
        seq = await self.log.head_seq()
        self._head = (time.monotonic(), seq)
        return seq

    async def _watch_head(self) -> None:
        for tick in itertools.count():
            try:
                await self._read_head()
                if self.snapshots is not None and tick % 20 == 19:  # every 5 s
                    await self.snapshots.refresh()  # the log's span and snapshots kept
            except Exception as exc:  # NATS away: head_seq asks itself, and raises
                log.debug("head_read_failed", error=repr(exc))
            await asyncio.sleep(HEAD_EVERY_S)

    async def start(self) -> None:
        if self.snapshots is not None:
            loaded = await self.snapshots.start_from(self.state)  # GapError: refused
            if loaded is not None:
                self._adopt(loaded)
                with contextlib.suppress(Exception):  # NATS away: no wait
                    self._whole_after = await self._read_head()
        await self.checkpointer.start()
        if self.tap is not None:
            await self.tap.start()
        self._tasks = [
            asyncio.create_task(self._run(), name="ppf-fold"),
            asyncio.create_task(self.dead_letters.run(), name="ppf-dlq"),
            asyncio.create_task(self._tick(), name="ppf-stats"),
            asyncio.create_task(self._idle_checkpoints(), name="ppf-checkpoint"),
            asyncio.create_task(self._watch_head(), name="ppf-head"),
        ]

    def _adopt(self, loaded: Loaded) -> None:
        """Start from an opened snapshot: its state replaces the checkpoint's, whose file
        is moved aside (its rows are of an older sequence: the new file gets them all,
        as the snapshot stores them, before the first checkpoint's own rows)."""
        state = loaded.state
        if self._db is not None and self._db.exists():
            for path in (self._db, self._db.with_name(self._db.name + ".wal")):
                if path.exists():
                    path.rename(path.with_name(f"{path.name}.before-{state.last_seq}"))
        self.checkpointer.begin_with(loaded.cut)
        self.state = self.folder.state = state

    async def snapshot_now(self) -> int:
        """Take a snapshot of the state applied now and keep it; its sequence."""
        if self.snapshots is None:
            raise RuntimeError("this fold has no snapshot store")
        async with self._cut:  # the fold stays still while the rows are encoded
            seq = self.state.last_seq
            blob = await self.snapshots.encode(self.state)
        await self.snapshots.keep(seq, blob, self.folder.applied)
        return seq

    async def stop(self) -> None:
        log.info("fold_stopping", last_seq=self.state.last_seq)  # a slow stop: before or in here
        if left := await stop_tasks(self._tasks, 10):
            log.warning("fold_tasks_left_running", count=left)
        self._tasks = []
        self.folder.finish()  # a round the stop came midway through: whole before the cut
        await self.checkpointer.flush(self.state)
        await self.checkpointer.close()
        if self.tap is not None:
            await self.tap.stop()
        log.info("fold_stopped", last_seq=self.state.last_seq)

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until the projection has applied ``seq``; False on timeout."""
        if self.state.last_seq >= seq:
            return True
        return await self._waiters.wait(seq, timeout)

    async def caught_up_now(self, timeout: float) -> bool:
        """Wait until the projection has applied the log as it is at this moment: for
        what another gateway granted a moment ago (it answered once the log had it). The
        head is read afresh: the cached one may predate that grant by 250 ms."""
        return await self.wait_for(await self.head_seq(max_age_s=0.0), timeout)

    async def _run(self) -> None:
        async for batch in self.log.read(self.state.last_seq + 1):
            messages = batch if isinstance(batch, list) else list(batch)
            if messages and messages[0][0] > self.state.last_seq + 1:
                # Trimmed behind us (projections/snapshot_policy.py): folding on would
                # build a state no replay gives. The fold stops; /healthz says so.
                gap = GapError(
                    f"the log went on at seq {messages[0][0]} after this fold's "
                    f"{self.state.last_seq}: restart it to start from a snapshot"
                )
                log.error("fold_gap", error=str(gap))
                raise gap
            i = 0
            while i < len(messages):
                # The cut lock: a checkpoint encodes its rows in chunks and yields
                # between them (queries go on), and no slice may change those rows
                # meanwhile. A slice that ends midway through a round of results keeps
                # it until the round is whole: no cut sees part of a message.
                async with self._cut:
                    # A slice of bounded time, not of a bounded count: a round of 500
                    # new proxies, a catch-up or a burst of locations all give the loop
                    # back within about SLICE_S.
                    i = self.folder.apply_for(messages, i, SLICE_S)
                    while self.folder.midway:
                        await self.foreground.yield_to(SLICE_S)
                        i = self.folder.apply_for(messages, i, SLICE_S)
                self._waiters.wake(self.state.last_seq)
                await self.foreground.yield_to(SLICE_S)  # queries, publishes go first
            async with self._cut:
                if self.tap is not None:
                    self.tap.feed(messages)
                await self._maybe_checkpoint()
            if self.snapshots is not None and self.snapshots.due(self.folder.applied):
                try:
                    await self.snapshot_now()
                except Exception as exc:  # the store away: the fold goes on, and says so
                    log.warning("snapshot_failed", error=repr(exc))

    async def _idle_checkpoints(self) -> None:
        """A quiet log still gets its checkpoint (and digest) within about ``every_ms``
        (looked for each second: one may have waited for the view, ``cut_waits_for``)."""
        while True:
            await asyncio.sleep(min(self.checkpointer.every_ms / 1000, 1.0))
            async with self._cut:
                await self._maybe_checkpoint()

    async def _maybe_checkpoint(self) -> None:
        """A checkpoint when one is due; but the first one after a snapshot was adopted
        writes every row the snapshot holds (no cut on this loop: its stored bytes, but
        seconds of the writer's core), so it waits until the fold has applied the log
        as it stood when the snapshot was adopted: a gateway is ready first (it was
        written after the few messages of a short tail, 4-5 s before /readyz said 200).
        A crash before then starts from the snapshot again."""
        if self.state.last_seq < self._whole_after:
            return
        # Far behind, by count alone; the view goes first (docs/decisions.md, The fold).
        await self.checkpointer.maybe(
            self.state, lambda: self.catching_up() or self.cut_waits_for(self.state)
        )

    async def _tick(self) -> None:
        """Sample the pipeline's rates; every 10 s, a metrics row for the tap."""
        last_row = 0.0
        while True:
            self.stats.sample(self.state, self.state.last_seq)
            if self.tap is not None and time.monotonic() - last_row >= 10:
                last_row = time.monotonic()
                try:
                    self.tap.metrics(await metrics_row(self))
                except Exception as exc:  # NATS away: skip this row, keep sampling
                    log.warning("metrics_row_failed", error=repr(exc))
            await asyncio.sleep(self.stats.every_s)

    def lag_s(self, head: int) -> float:
        """How far behind the head the fold is, in seconds of the log's own time."""
        if head <= self.state.last_seq or not self.folder.last_ts:
            return 0.0
        return round(max(time.time() - self.folder.last_ts / 1000, 0.0), 3)


async def metrics_row(fold: FoldService) -> dict[str, object]:
    """The figures an operator watches of ``fold``, in one flat row (the tap's, every 10 s)."""
    head = await fold.head_seq()
    row: dict[str, object] = {
        "applied_seq": fold.state.last_seq,
        "head_seq": head,
        "lag": max(head - fold.state.last_seq, 0),
        "lag_s": fold.lag_s(head),
        "proxies_known": len(fold.state.proxies),
        "sources": len(fold.state.sources),
        "agents": len(fold.state.agents),
        "rejected": fold.folder.rejected,
        "resent": fold.folder.resent,
    }
    for kind, rate in fold.stats.rates()["1m"].items():
        row[f"rate_1m.{kind}"] = rate
    for op, n in fold.log.ops.items():
        row[f"nats.{op}"] = n
    if fold.deposits is not None:  # puts, gets, lists, deletes, by outcome
        for op, n in fold.deposits.ops.items():
            row[f"deposit.{op}"] = n
    if fold.tap is not None:
        row["tap.dropped"] = fold.tap.stats.dropped + fold.tap.stats.failed
    return row
