"""Immutable query snapshots of the proxy pool, swapped whole.

Rows in the live state are mutated by the fold; a query reads a snapshot instead: plain
tuples copied from the rows at one applied sequence, pre-sorted by latency and by last
seen, and the text lines of ``format=txt`` pre-rendered. A new snapshot replaces the
old one in a single assignment, so a reader sees one sequence or the next, never half.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from projections.readmodels import ProxyFilter
from reducers import State, trust
from reducers.pool import band_edges

__all__ = ["CENSUS_MS", "ProxySnapshot", "ProxyView", "build"]

CENSUS_MS = 5_000


class ProxyView(NamedTuple):
    latency: float
    ip: str
    port: int
    proto: str
    protos: tuple[str, ...]
    anonymity: str
    country: str
    asn: int
    as_org: str
    mitm: bool
    https: str
    last_seen: int
    first_seen: int
    exit_ip: str
    confirmations: int
    fail_streak: int
    agents: int
    sources: tuple[str, ...]
    samples: bytes
    line: str  # "proto://ip:port\n"
    confirmed: bool  # an agent trusted now confirmed it (reducers/trust.py)


Index = dict[object, tuple[ProxyView, ...]]


@dataclass(frozen=True, slots=True)
class ProxySnapshot:
    seq: int
    ttl_s: int
    by_latency: tuple[ProxyView, ...]
    by_last_seen: tuple[ProxyView, ...]
    # Views by proto, anonymity, country and ASN, each sorted by latency: a selective
    # filter scans its own short list instead of the whole pool.
    indexes: dict[str, Index]
    # census() answers, by the CENSUS_MS slice of time they were counted at.
    censuses: dict[int, dict[str, Any]] = field(default_factory=dict)

    def census(self, now: int) -> dict[str, Any]:
        """The pool within the TTL as ``GET /v1/proxies`` sees it: ``alive`` is what it
        serves by default (confirmed by an agent trusted now, latest check not failed,
        never seen tampering), by protocol, anonymity and country; ``unconfirmed``,
        ``suspect`` and ``mitm`` on their own lines. One walk of the alive rows, kept for
        the slice of time it was counted in (the TTL's edge moves that slowly)."""
        at = now // CENSUS_MS
        found = self.censuses.get(at)
        if found is not None:
            return found
        alive_from, _ = band_edges(now, self.ttl_s)
        counts = {"alive": 0, "unconfirmed": 0, "suspect": 0, "mitm": 0}
        by: dict[str, dict[str, int]] = {"by_proto": {}, "by_anonymity": {}, "by_country": {}}
        for v in self.by_last_seen:
            if v.last_seen < alive_from:
                break  # newest first: the rest are older
            line = (
                "suspect"
                if v.fail_streak
                else "unconfirmed"
                if not v.confirmed
                else "mitm"
                if v.mitm
                else "alive"
            )
            counts[line] += 1
            if line == "alive":
                for name, value in (
                    ("by_proto", v.proto),
                    ("by_anonymity", v.anonymity or "unknown"),
                    ("by_country", v.country or "unknown"),
                ):
                    by[name][value] = by[name].get(value, 0) + 1
        found = {"seq": self.seq, **counts, **{k: dict(sorted(d.items())) for k, d in by.items()}}
        self.censuses.clear()  # one slice kept: the latest
        self.censuses[at] = found
        return found

    def _base(self, f: ProxyFilter) -> tuple[ProxyView, ...] | None:
        one_country = f.country[0] if f.country is not None and len(f.country) == 1 else None
        keys = {"proto": f.proto, "anonymity": f.anonymity, "country": one_country, "asn": f.asn}
        lists = [self.indexes[k].get(v, ()) for k, v in keys.items() if v is not None]
        return min(lists, key=len) if lists else None

    def select(
        self, f: ProxyFilter, now: int, *, sort: str = "latency", limit: int = 100
    ) -> Iterator[ProxyView]:
        """Matching views in order, stopping after ``limit`` (0: all)."""
        base = self._base(f)
        if base is not None and sort == "last_seen" and len(base) * 8 > len(self.by_latency):
            base = None  # a broad filter: walking the last-seen order stops sooner
        if base is not None and sort == "last_seen":
            hits = sorted(self._scan(base, f, now, "latency", 0), key=_by_last_seen)
            yield from hits[:limit] if limit else hits
            return
        if base is None:
            base = self.by_last_seen if sort == "last_seen" else self.by_latency
        yield from self._scan(base, f, now, sort, limit)

    def _scan(
        self, rows: tuple[ProxyView, ...], f: ProxyFilter, now: int, sort: str, limit: int
    ) -> Iterator[ProxyView]:
        alive_from, stale_from = band_edges(now, self.ttl_s)
        oldest, newest = {
            "alive": (alive_from, None),
            "suspect": (alive_from, None),
            "unconfirmed": (alive_from, None),
            "stale": (stale_from, alive_from - 1),
            "dead": (None, stale_from - 1),
        }.get(f.status, (None, None))
        # Within the TTL (readmodels.status_at): suspect when its latest check failed;
        # else alive once an agent trusted now confirmed it, unconfirmed until then.
        failing = {"alive": False, "unconfirmed": False, "suspect": True}.get(f.status)
        confirmed = {"alive": True, "unconfirmed": False}.get(f.status)
        fresh = now - f.fresh_s * 1000 if f.fresh_s is not None else None
        taken = 0
        for v in rows:
            seen = v.last_seen
            if (oldest is not None and seen < oldest) or (newest is not None and seen > newest):
                continue
            if fresh is not None and seen < fresh:
                continue
            if failing is not None and (v.fail_streak > 0) != failing:
                continue
            if confirmed is not None and v.confirmed != confirmed:
                continue
            if f.proto is not None and f.proto not in v.protos:
                continue
            if f.anonymity is not None and v.anonymity != f.anonymity:
                continue
            if f.max_latency_ms is not None and v.latency > f.max_latency_ms:
                if sort != "last_seen":
                    return  # sorted by latency: nothing further can match
                continue
            if f.country is not None and v.country not in f.country:
                continue
            if f.as_org is not None and v.as_org != f.as_org:
                continue
            if f.asn is not None and v.asn != f.asn:
                continue
            if f.mitm is not None and v.mitm != f.mitm:
                continue
            if f.https is not None and (v.https == "yes") != f.https:
                continue
            yield v
            taken += 1
            if taken == limit:
                return


def _by_last_seen(v: ProxyView) -> tuple[int, str, int]:
    return (-v.last_seen, v.ip, v.port)


def _index(views: tuple[ProxyView, ...], key: str) -> Index:
    groups: dict[object, list[ProxyView]] = {}
    if key == "proto":
        for v in views:
            for p in v.protos:
                groups.setdefault(p, []).append(v)
    else:
        for v in views:
            groups.setdefault(getattr(v, key), []).append(v)
    return {k: tuple(vs) for k, vs in groups.items()}


def build(state: State) -> ProxySnapshot:
    vouched = trust.vouched(state)
    views = [
        ProxyView(
            r.latency_ema,
            r.ip,
            r.port,
            r.proto,
            r.protos,
            r.anonymity,
            r.country,
            r.asn,
            r.as_org,
            r.mitm,
            r.https,
            r.last_seen,
            r.first_seen,
            r.exit_ip,
            r.confirmations,
            r.fail_streak,
            len(r.agents),
            r.sources,
            r.samples,
            f"{r.proto}://{r.ip}:{r.port}\n",
            vouched(r.agents),
        )
        for r in state.proxies.values()
    ]
    by_latency = tuple(sorted(views, key=lambda v: (v.latency, v.ip, v.port)))
    return ProxySnapshot(
        seq=state.last_seq,
        ttl_s=state.settings.proxy_ttl_s,
        by_latency=by_latency,
        by_last_seen=tuple(sorted(views, key=_by_last_seen)),
        indexes={k: _index(by_latency, k) for k in ("proto", "anonymity", "country", "asn")},
    )
