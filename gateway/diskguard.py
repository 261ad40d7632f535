"""The disk budget guard: bulk imports pause before the store fills the disk.

Seed leases are not granted, and ``ppf seed plan`` refuses, while the deposit bucket or
the log's stream holds more than ``share`` of the disk the NATS store lives on; both
resume once below it. Everyday work (sources, rechecks) goes on: the guard only holds
back what can grow the store by gigabytes. The reason is in ``/v1/stats`` (``seed
.paused``), on the dashboard and in ``ppf seed status``. Before that, from ``WARN_AT``
of the limit, ``warning`` says so (``/v1/stats`` ``warnings``, ``/metrics``
``ppf_store_used_ratio``): the log grows from what agents send, refused input too.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

import structlog

from projections.tasks import stop_tasks

__all__ = ["WARN_AT", "DiskGuard", "DiskUse", "verdict"]

log = structlog.get_logger("ppf.diskguard")


class DiskUse(NamedTuple):
    disk_bytes: int  # the size of the disk the store is on
    stream_bytes: int
    deposit_bytes: int


WARN_AT = 0.8  # of the limit, the store's use is warned of


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def verdict(use: DiskUse, share: float) -> str:
    """Why bulk imports pause ("" when they need not). Pure."""
    if use.disk_bytes <= 0:
        return ""
    for what, held in (("the deposit store", use.deposit_bytes), ("the log", use.stream_bytes)):
        if held > share * use.disk_bytes:
            return (
                f"{what} holds {_gb(held)}, {held / use.disk_bytes:.0%} of the disk's "
                f"{_gb(use.disk_bytes)} (limit {share:.0%})"
            )
    return ""


class DiskGuard:
    """Weighs the store every ``every_s``; ``reason`` says why imports pause now."""

    def __init__(
        self,
        stored: Callable[[], Awaitable[tuple[int, int]]],
        path: Path,
        share: float,
        every_s: float = 10.0,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the disk share is a fraction in (0, 1], not {share}")
        self.stored = stored
        self.path = path
        self.share = share
        self.every_s = every_s
        self.reason = ""
        self.use = DiskUse(0, 0, 0)
        self.error = ""  # why the last weighing failed (the last verdict holds meanwhile)
        self._task: asyncio.Task[None] | None = None

    async def weigh(self) -> str:
        try:
            stream, deposits = await self.stored()
            disk = shutil.disk_usage(self.path).total
        except Exception as exc:  # NATS away: keep the last verdict, say why
            self.error = repr(exc)[:300]
            return self.reason
        self.error = ""
        self.use = DiskUse(disk, stream, deposits)
        reason = verdict(self.use, self.share)
        if reason and not self.reason:
            log.warning("bulk_imports_paused", why=reason)
        elif self.reason and not reason:
            log.info("bulk_imports_resumed", use=self.use._asdict())
        self.reason = reason
        return reason

    @property
    def used_ratio(self) -> float:
        """The larger of the log's and the deposits' bytes over the limit (1: paused)."""
        limit = self.share * self.use.disk_bytes
        if limit <= 0:
            return 0.0
        return max(self.use.stream_bytes, self.use.deposit_bytes) / limit

    @property
    def warning(self) -> str:
        """Said from ``WARN_AT`` of the limit ("" below it)."""
        ratio = self.used_ratio
        if ratio < WARN_AT:
            return ""
        return (
            f"the store is at {ratio:.0%} of its limit ({self.share:.0%} of the disk's "
            f"{_gb(self.use.disk_bytes)}): bulk imports pause at 100%; trim the log "
            "(snapshots) or give the store more room"
        )

    def status(self) -> dict[str, object]:
        return {
            "warning": self.warning,
            "paused": self.reason,
            "share": self.share,
            "disk_bytes": self.use.disk_bytes,
            "stream_bytes": self.use.stream_bytes,
            "deposit_bytes": self.use.deposit_bytes,
            "error": self.error,
        }

    async def _run(self) -> None:
        while True:
            await self.weigh()
            await asyncio.sleep(self.every_s)

    async def start(self) -> None:
        await self.weigh()
        self._task = asyncio.create_task(self._run(), name="ppf-diskguard")

    async def stop(self) -> None:
        # Its step is a NATS request: a bare cancel can be lost on 3.11 (projections/tasks.py).
        if self._task is not None:
            await stop_tasks([self._task], 10)
            self._task = None
