"""Liveness bands, lease liveness, and the pool's composition kept by deltas.

The bands (docs/architecture.md §4) are written here once: ``alive`` while seen within the
TTL, ``stale`` up to three TTLs, ``dead`` after, and evicted from memory when the log's
own time passes that. The reducers evict by them, the read models answer by them.

``Composition`` counts proxies by (protocol, anonymity, country) per bucket of ``last_seen``; the
proxy reducers move a row between counts as they change it, so ``/v1/stats`` sums a few
hundred buckets instead of scanning a million rows. It is derived state: rebuilt from
the rows on restore, never persisted, not part of the digest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reducers.rows import LeaseRow, ProxyRow

__all__ = [
    "BANDS",
    "BUCKET_MS",
    "DEAD_AFTER_TTLS",
    "FRESH_STATUSES",
    "STATUSES",
    "Composition",
    "band_edges",
    "counted",
    "fresh_status",
    "lease_live",
    "liveness",
    "seen_bounds",
]

DEAD_AFTER_TTLS = 3
BANDS = ("alive", "stale", "dead")  # by age (``liveness``)
FRESH_STATUSES = ("alive", "unconfirmed", "suspect", "mitm")  # within the TTL (``fresh_status``)
# What /v1/proxies' ``status`` says of a row and selects by, in the order the API
# document lists them: a fresh status within the TTL (mitm apart: a field and a filter of its
# own), else the band.
STATUSES = ("alive", "suspect", "unconfirmed", "stale", "dead")
# Counts are kept per 30 s of last_seen: a band edge falls inside one bucket, which is
# counted whole on the fresher side (at most 30 s of confirmations misplaced), and a
# stats call sums (3 TTLs + 10 min) / 30 s buckets: about 1,500 at the default TTL.
BUCKET_MS = 30_000


def band_edges(now: int, ttl_s: int) -> tuple[int, int]:
    """(alive_from, stale_from): seen at or after the first is alive, at or after the
    second stale, before it dead (and evicted once the log's time passes it)."""
    ttl = ttl_s * 1000
    return now - ttl, now - DEAD_AFTER_TTLS * ttl


def seen_bounds(status: str, now: int, ttl_s: int) -> tuple[int | None, int | None]:
    """The ``last_seen`` range (oldest, newest; None where open) of the rows whose status
    is ``status`` at ``now``: a fresh status's is the alive band's."""
    alive_from, stale_from = band_edges(now, ttl_s)
    if status in FRESH_STATUSES:
        return alive_from, None
    if status == "stale":
        return stale_from, alive_from - 1
    if status == "dead":
        return None, stale_from - 1
    return None, None


def liveness(age_ms: int, ttl_s: int) -> str:
    """alive while seen within the TTL, stale (due for recheck) up to 3 TTLs, then dead
    (the bands of ``band_edges``, as ages: this runs for every row a query serves)."""
    ttl = ttl_s * 1000
    if age_ms <= ttl:
        return "alive"
    if age_ms <= DEAD_AFTER_TTLS * ttl:
        return "stale"
    return "dead"


def fresh_status(failing: bool, confirmed: bool, mitm: bool) -> str:
    """Where a proxy seen within the TTL stands: ``suspect`` while its latest check
    failed (back with its next success), ``unconfirmed`` until an agent trusted now
    confirmed it (reducers/trust.py), ``mitm`` when seen tampering, else ``alive``.
    ``/v1/proxies`` serves ``alive`` alone by default; its ``status`` field says the
    fresh status without the mitm line (``mitm`` is a field and a filter of its own). The
    census of /v1/stats, the consumers' share (reducers/reports.py) and the status all
    read it here."""
    if failing:
        return "suspect"
    if not confirmed:
        return "unconfirmed"
    return "mitm" if mitm else "alive"


def lease_live(row: LeaseRow | None, now: int) -> bool:
    """A lease holds until its ``expires_at`` inclusive; the ledger frees it after."""
    return row is not None and row.status == "leased" and row.expires_at >= now


Key = tuple[str, str, str]  # (proto, anonymity, country)


def counted(rows: Iterable[Any]) -> tuple[Composition, Composition]:
    """The pool's composition and its failing part, counted from the rows (a restore):
    anything with a ProxyRow's ``last_seen``, ``proto``, ``anonymity``, ``country`` and
    ``fail_streak`` (a snapshot's loader counts them in another process from those
    columns alone)."""
    composition, failing = Composition(), Composition()
    for row in rows:
        composition.add(row)
        if row.fail_streak:
            failing.add(row)
    return composition, failing


class Composition:
    """Proxies by (protocol, anonymity, country) per ``last_seen`` bucket, kept by the
    reducers."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: dict[int, dict[Key, int]] = {}

    def add(self, row: ProxyRow) -> None:
        counts = self.buckets.get(row.last_seen // BUCKET_MS)
        if counts is None:
            counts = self.buckets[row.last_seen // BUCKET_MS] = {}
        key = (row.proto, row.anonymity, row.country)
        counts[key] = counts.get(key, 0) + 1

    def counts(self) -> list[tuple[int, list[tuple[str, str, str, int]]]]:
        """Plain data for another process: ``from_counts`` makes the same Composition."""
        return [(b, [(*key, n) for key, n in keys.items()]) for b, keys in self.buckets.items()]

    @classmethod
    def from_counts(cls, counts: Iterable[Any]) -> Composition:
        made = cls()
        made.buckets = {b: {(p, a, c): n for p, a, c, n in keys} for b, keys in counts}
        return made

    def remove(self, last_seen: int, proto: str, anonymity: str, country: str) -> None:
        bucket = last_seen // BUCKET_MS
        counts = self.buckets[bucket]
        key = (proto, anonymity, country)
        left = counts[key] - 1
        if left:
            counts[key] = left
        else:
            del counts[key]
            if not counts:
                del self.buckets[bucket]

    def moved(self, row: ProxyRow, country: str) -> None:
        """``row`` is now counted under ``country`` (same bucket: its ``last_seen`` stays);
        one bucket lookup where ``remove`` and ``add`` take two (``Located`` runs this
        for every new address)."""
        counts = self.buckets[row.last_seen // BUCKET_MS]
        old = (row.proto, row.anonymity, row.country)
        left = counts[old] - 1
        if left:
            counts[old] = left
        else:
            del counts[old]
        new = (row.proto, row.anonymity, country)
        counts[new] = counts.get(new, 0) + 1

    def bands(self, now: int, ttl_s: int) -> dict[str, dict[Key, int]]:
        """Counts by band at ``now``: {"alive": {(proto, anonymity, country): n}, ...}."""
        alive_from, stale_from = band_edges(now, ttl_s)
        out: dict[str, dict[Key, int]] = {"alive": {}, "stale": {}, "dead": {}}
        for bucket, counts in self.buckets.items():
            newest = bucket * BUCKET_MS + BUCKET_MS - 1
            band = out[
                "alive" if newest >= alive_from else "stale" if newest >= stale_from else "dead"
            ]
            for key, n in counts.items():
                band[key] = band.get(key, 0) + n
        return out
