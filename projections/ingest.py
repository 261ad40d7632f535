"""The deposit ingest: reads announced deposits by key and folds them into the log.

Driven only by what the projection knows: a ``Deposited`` puts its key in
``state.pending_deposits`` and the ingest reads it at once; a key whose read failed is
tried again on the slow sweep (``sweep_s``), never sooner. Nothing here lists the
bucket. Each read is checked against the digest the log recorded, and its outcome goes
back into the log: the events derived from it (``ProxyWorked`` for a seed batch's
working proxies, ``SourceAdded`` for its proxy lists, naming the agent that deposited
them, so trust, quotas and validation apply as to its own reports) and then
``DepositFolded``; or ``DepositRejected`` with the attempt's number, counted from the
log, so a restart cannot reset the budget (reducers/deposits.py poisons at five).

Retention (projections/retention.py) runs in the same loop, hourly: deposits past their
age or the store's budget are deleted by key, oldest first, from the projection's own
records.

Every id is fixed by the deposit's key, so several gateways ingesting the same deposit
put one copy of each event in the log (the stream's duplicate window), and folding a
deposit twice changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog

from eventlog.protocol import DepositError, DepositStore
from events import (
    DepositFolded,
    DepositRejected,
    Event,
    ProxyWorked,
    SourceAdded,
    deposit_key_id,
    normalize_url,
    url_id,
)
from events.batches import group
from events.keys import derived_id, parse_key
from events.mint import now_ms
from events.wire import SeedBatch
from projections.live import FoldService
from projections.retention import expired
from projections.tasks import stop_tasks
from reducers.state import DepositRow

__all__ = ["DepositIngest", "Retention", "derive"]

log = structlog.get_logger("ppf.ingest")

SERVICE = "fold"  # the agent name on the service's own records of deposits
_batch = msgspec.json.Decoder(SeedBatch)


def _read_mark(path: Path | None) -> dict[str, float]:
    if path is None or not path.exists():
        return {}
    try:
        mark = json.loads(path.read_text())
        return {k: float(mark[k]) for k in ("deleted_through_seq", "reconciled_at") if k in mark}
    except (ValueError, TypeError, AttributeError) as exc:
        # Unreadable: start over. Deleting again what is gone costs a lookup each.
        log.warning("retention_mark_unreadable", path=str(path), error=repr(exc))
        return {}


class MalformedDeposit(ValueError):
    """Content that is not what its key promises."""


def derive(row: DepositRow, data: bytes, *, batches: bool = False) -> list[Event]:
    """The events a deposit's content says, with ids fixed by its key. Pure. With
    ``batches`` its working proxies go as rounds (``ProxiesChecked`` keyed by the
    deposit's key id), each under the id its first result had."""
    parts = parse_key(row.key)
    if parts is None or parts.form != "seed":
        return []  # pages and inputs are kept for reparse and planning: nothing to say
    try:
        batch = _batch.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedDeposit(f"not a seed batch: {exc}") from exc
    if (batch.start, batch.next) != (row.start, row.next):
        raise MalformedDeposit(
            f"covers {batch.start}-{batch.next}, announced {row.start}-{row.next}"
        )
    kid = deposit_key_id(row.key)
    out: list[Event] = []
    for i, p in enumerate(batch.worked):
        out.append(
            ProxyWorked(
                id=derived_id(kid, i),
                agent=row.agent,
                at=row.at,
                ip=p.ip,
                port=p.port,
                proto=p.proto,
                latency_ms=p.latency_ms,
                exit_ip=p.exit_ip,
                anonymity=p.anonymity,  # type: ignore[arg-type]
                mitm=p.mitm,
                judge=p.judge,
                https=p.https,  # type: ignore[arg-type]
            )
        )
    if batches:
        out = group(out, key=kid)
    base = len(batch.worked)
    for i, url in enumerate(batch.sources):
        out.append(
            SourceAdded(
                id=derived_id(kid, base + i),
                agent=row.agent,
                at=row.at,
                url=normalize_url(url),
                url_id=url_id(url),
                origin="seed",
            )
        )
    return out


@dataclass(frozen=True)
class Retention:
    """How long and how much the deposit store keeps (projections/retention.py);
    ``mark``: the file that remembers the seq of the last deposit deleted."""

    max_age_s: float = 30 * 86_400.0
    max_bytes: int = 20 * 1024**3
    mark: Path | None = None
    per_pass: int = 1_000  # deletes a pass: a first pass over a big store is spread out
    # A pass scans every deposit row (the rows stay in the projection: no event says a
    # deposit is gone), so it runs this often, not at every sweep.
    every_s: float = 3_600.0
    # The reconcile: one list of the bucket against the projection at most this often
    # (None: never, the default; ``--reconcile-deposits`` sets a day).
    reconcile_every_s: float | None = None


class DepositIngest:
    """One per fold that persists (``ppf up``, ``ppf fold``)."""

    def __init__(
        self,
        fold: FoldService,
        store: DepositStore,
        *,
        poll_s: float = 0.25,
        sweep_s: float = 60.0,
        retention: Retention | None = None,
    ) -> None:
        self.fold = fold
        self.store = store
        self.poll_s = poll_s
        self.sweep_s = sweep_s
        self.retention = retention
        self._failed: dict[str, float] = {}  # key -> when its last read failed
        self._task: asyncio.Task[None] | None = None
        self.folded = 0
        self.rejected = 0
        self.deleted = 0  # by retention, this process
        mark = _read_mark(retention.mark if retention else None)
        self.deleted_through = int(mark.get("deleted_through_seq", 0))
        self.reconciled_at = float(mark.get("reconciled_at", 0.0))  # unix s
        self.reconciled: dict[str, object] = {}  # what the last reconcile found
        self._retained_at = -1e9

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ppf-ingest")

    async def stop(self) -> None:
        # Its step is a NATS request: a bare cancel can be lost on 3.11 (projections/tasks.py).
        if self._task is not None:
            await stop_tasks([self._task], 10)
            self._task = None

    def _due(self, now: float) -> list[str]:
        """Pending keys never tried here, and failed ones whose sweep has come."""
        failed = self._failed
        return sorted(
            k
            for k in self.fold.state.pending_deposits
            if k not in failed or now - failed[k] >= self.sweep_s
        )

    async def retain(self) -> int:
        """Delete, by key, the deposits past retention; how many were deleted."""
        ret = self.retention
        if ret is None:
            return 0
        cutoff = now_ms() - int(ret.max_age_s * 1000)
        rows = expired(
            self.fold.state.deposits.values(),
            after_seq=self.deleted_through,
            cutoff_ms=cutoff,
            max_bytes=ret.max_bytes,
        )
        done = 0
        for key, seq in [(r.key, r.seq) for r in rows[: ret.per_pass]]:
            row = self.fold.state.deposits.get(key)
            if row is not None and row.seq == seq:  # not announced again meanwhile
                await self.store.delete(key)  # gone already (a restart): counted, fine
            self.deleted_through = seq
            done += 1
        if done:
            self.deleted += done
            log.info("deposits_retired", deleted=done, through_seq=self.deleted_through)
            self._save_mark()
        return done

    def _save_mark(self) -> None:
        if self.retention is not None and self.retention.mark is not None:
            mark = {
                "deleted_through_seq": self.deleted_through,
                "reconciled_at": self.reconciled_at,
            }
            self.retention.mark.write_text(json.dumps(mark))

    async def reconcile(self) -> dict[str, object] | None:
        """The one pass that lists the bucket, at most every ``reconcile_every_s`` (None
        when not due): keys stored but never announced (an agent that died between its
        put and its ``Deposited``), and keys folded and kept that the store lacks.
        Reported (log, ``reconciled``), never acted on: either may be a put in flight."""
        ret = self.retention
        every = ret.reconcile_every_s if ret is not None else None
        if every is None or time.time() - self.reconciled_at < every:
            return None
        stored = await self.store.keys()
        deposits = self.fold.state.deposits
        orphans = sorted(stored - set(deposits))
        missing = sorted(
            k
            for k, row in deposits.items()
            if row.status == "folded"
            and k not in stored
            and (k.startswith("input/") or row.seq > self.deleted_through)
        )
        self.reconciled_at = time.time()
        self.reconciled = {
            "at": self.reconciled_at,
            "stored": len(stored),
            "orphans": len(orphans),
            "missing": len(missing),
            "orphan_keys": orphans[:20],
            "missing_keys": missing[:20],
        }
        self._save_mark()
        log.info("deposits_reconciled", **self.reconciled)
        return self.reconciled

    async def _run(self) -> None:
        while True:
            every = self.retention.every_s if self.retention is not None else self.sweep_s
            if time.monotonic() - self._retained_at >= every:
                self._retained_at = time.monotonic()
                try:
                    await self.retain()
                    await self.reconcile()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NATS away: the next sweep goes on from the mark
                    log.warning("retention_failed", error=repr(exc))
            for key in self._due(time.monotonic()):
                try:
                    await self.ingest(key)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NATS away: the sweep tries again
                    log.warning("ingest_failed", key=key, error=repr(exc))
                    self._failed[key] = time.monotonic()
            await asyncio.sleep(self.poll_s)

    async def ingest(self, key: str) -> bool:
        """Read, check and fold one pending deposit; True when folded."""
        state = self.fold.state
        row = state.deposits.get(key)
        if row is None or row.status != "pending":
            self._failed.pop(key, None)
            return False
        attempt = row.attempts + 1
        kid = deposit_key_id(key)
        try:
            data = await self.store.get(key, row.sha256)
            derived = derive(row, data, batches=state.settings.batches)
        except (DepositError, MalformedDeposit) as exc:
            if isinstance(exc, DepositError):  # its text begins with its reason
                reason, said = exc.reason, str(exc)
            else:
                reason, said = "malformed", f"malformed: {exc}"
            event: Event = DepositRejected(
                id=f"rejected:{kid}:{attempt}",
                agent=SERVICE,
                at=row.at,
                key=key,
                attempt=attempt,
                reason=said[:500],
            )
            published = await self.fold.log.publish(event)
            await self.fold.wait_for(published.seq, 10)
            self._failed[key] = time.monotonic()
            self.rejected += 1
            log.warning("deposit_rejected", key=key, attempt=attempt, reason=reason)
            return False
        if derived:
            await self.fold.log.publish_many(derived)
        done = DepositFolded(
            id=f"folded:{kid}",
            agent=SERVICE,
            at=row.at,
            key=key,
            attempt=attempt,
            reason=f"{len(derived)} events",
        )
        published = await self.fold.log.publish(done)
        await self.fold.wait_for(published.seq, 10)
        self._failed.pop(key, None)
        self.folded += 1
        return True
