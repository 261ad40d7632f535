"""Immutable query snapshots of the proxy pool, swapped whole.

Rows in the live state are mutated by the fold; a query reads a snapshot instead: plain
tuples copied from the rows at one applied sequence, pre-sorted by latency and by last
seen, and the text lines of ``format=txt`` pre-rendered. A new snapshot replaces the
old one in a single assignment, so a reader sees one sequence or the next, never half.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from projections.readmodels import ProxyFilter
from reducers import State

__all__ = ["ProxySnapshot", "ProxyView", "build"]


class ProxyView(NamedTuple):
    latency: float
    ip: str
    port: int
    proto: str
    protos: tuple[str, ...]
    anonymity: str
    country: str
    asn: int
    mitm: bool
    last_seen: int
    first_seen: int
    exit_ip: str
    confirmations: int
    fail_streak: int
    agents: int
    sources: tuple[str, ...]
    samples: bytes
    line: str  # "proto://ip:port\n"


@dataclass(frozen=True, slots=True)
class ProxySnapshot:
    seq: int
    ttl_s: int
    by_latency: tuple[ProxyView, ...]
    by_last_seen: tuple[ProxyView, ...]

    def select(
        self, f: ProxyFilter, now: int, *, sort: str = "latency", limit: int = 100
    ) -> Iterator[ProxyView]:
        """Matching views in order, stopping after ``limit`` (0: all)."""
        rows = self.by_last_seen if sort == "last_seen" else self.by_latency
        ttl = self.ttl_s * 1000
        lo, hi = {
            "alive": (-(1 << 62), ttl),
            "stale": (ttl + 1, 3 * ttl),
            "dead": (3 * ttl + 1, None),
        }.get(f.status, (0, None))
        fresh = f.fresh_s * 1000 if f.fresh_s is not None else None
        taken = 0
        for v in rows:
            age = now - v.last_seen
            if age < lo or (hi is not None and age > hi):
                continue
            if fresh is not None and age > fresh:
                continue
            if f.proto is not None and f.proto not in v.protos:
                continue
            if f.anonymity is not None and v.anonymity != f.anonymity:
                continue
            if f.max_latency_ms is not None and v.latency > f.max_latency_ms:
                if sort != "last_seen":
                    return  # sorted by latency: nothing further can match
                continue
            if f.country is not None and v.country != f.country:
                continue
            if f.asn is not None and v.asn != f.asn:
                continue
            if f.mitm is not None and v.mitm != f.mitm:
                continue
            yield v
            taken += 1
            if taken == limit:
                return


def build(state: State) -> ProxySnapshot:
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
            r.mitm,
            r.last_seen,
            r.first_seen,
            r.exit_ip,
            r.confirmations,
            r.fail_streak,
            len(r.agents),
            r.sources,
            r.samples,
            f"{r.proto}://{r.ip}:{r.port}\n",
        )
        for r in state.proxies.values()
    ]
    by_latency = tuple(sorted(views, key=lambda v: (v.latency, v.ip, v.port)))
    by_last_seen = tuple(sorted(views, key=lambda v: (-v.last_seen, v.ip, v.port)))
    return ProxySnapshot(
        seq=state.last_seq,
        ttl_s=state.settings.proxy_ttl_s,
        by_latency=by_latency,
        by_last_seen=by_last_seen,
    )
