"""Answers at a given ``now``: source scores, due sources, proxy liveness and queries.

Pure functions of the state and the caller's ``now`` (unix ms): the gateway passes its
clock, a test passes any time it likes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from events.sites import THROUGH
from projections.core.quality import datacenter, stable_since, uptime
from reducers import sites, trust
from reducers.pool import fresh_status, liveness
from reducers.rows import ProxyQuality, SiteCells
from reducers.state import ProxyRow, SourceRow, State

__all__ = [
    "NEVER_FETCHED_BASE",
    "ProxyFilter",
    "ScoreWeights",
    "due_score",
    "due_sources",
    "liveness",
    "nearest_rank",
    "percentile",
    "proxy_status",
    "query_proxies",
    "rank_due",
    "scored_due",
    "source_score",
    "status_at",
]

NEVER_FETCHED_BASE = 1_000_000.0
RESEED_MS = 6 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Query-time weights of the source score (docs/architecture.md §4); configuration."""

    yield_divisor: float = 100.0
    working: float = 0.5
    error: float = 0.5
    error_cap: float = 4.0
    stale: float = 0.2
    stale_cap: float = 1.5
    socks_boost: float = 0.25


def source_score(row: SourceRow, now: int, w: ScoreWeights = ScoreWeights()) -> float:
    if row.check_time == 0:
        base = NEVER_FETCHED_BASE
    else:
        base = (now - row.check_time) / (max(row.check_interval, 1) * 1000)
    boost = w.socks_boost if row.proto_hint.startswith("socks") else 0.0
    return (
        base
        + min(row.yield_rate / w.yield_divisor, 1.0)
        + w.working * row.working_ratio
        - min(w.error * row.error, w.error_cap)
        - min(w.stale * row.stale_count, w.stale_cap)
        + boost
    )


def _due(row: SourceRow, score: float, now: int) -> bool:
    if score >= 1.0:
        return True
    # An erroring source is retried at least every 6 h, whatever its score (reseed).
    return row.error > 0 and now - row.check_time >= RESEED_MS


def due_score(row: SourceRow, now: int, w: ScoreWeights = ScoreWeights()) -> float | None:
    """The source's score when it is due at ``now``, else None."""
    if not row.url:
        return None
    score = source_score(row, now, w)
    return score if _due(row, score, now) else None


def scored_due(
    rows: Iterable[SourceRow], now: int, w: ScoreWeights = ScoreWeights()
) -> list[tuple[float, SourceRow]]:
    """The due ones among ``rows`` with their scores, in no order (``rank_due``)."""
    scored = []
    for row in rows:
        score = due_score(row, now, w)
        if score is not None:
            scored.append((score, row))
    return scored


def rank_due(scored: list[tuple[float, SourceRow]]) -> list[tuple[float, SourceRow]]:
    """``scored`` in place, highest score first (never fetched first); ties by url_id."""
    scored.sort(key=lambda pair: (-pair[0], pair[1].url_id))
    return scored


def due_sources(
    state: State, now: int, limit: int = 100, w: ScoreWeights = ScoreWeights()
) -> list[tuple[float, SourceRow]]:
    """Due sources, highest score first (never fetched first); ties by url_id."""
    ranked = rank_due(scored_due(state.sources.values(), now, w))
    return ranked[:limit] if limit else ranked


def proxy_status(row: ProxyRow, now: int, ttl_s: int, confirmed: bool = True) -> str:
    return status_at(row.last_seen, now, ttl_s, confirmed, row.fail_streak > 0)


def status_at(last_seen: int, now: int, ttl_s: int, confirmed: bool, failed: bool = False) -> str:
    """alive, stale or dead by its age. Within the TTL: suspect when its latest check
    failed (it comes back with its next success); unconfirmed when no agent trusted now
    (reducers/trust.py) confirmed it. Only alive is served by default."""
    band = liveness(now - last_seen, ttl_s)
    if band != "alive":
        return band
    return fresh_status(failed, confirmed, mitm=False)  # the status field: mitm apart


def percentile(samples: Iterable[int], q: float) -> int | None:
    ordered = sorted(samples)
    return nearest_rank(ordered, q) if ordered else None


def nearest_rank(ordered: list[int], q: float) -> int:
    """The ``q`` quantile of sorted, non-empty ``ordered`` (nearest rank)."""
    last = len(ordered) - 1
    return ordered[min(last, max(0, round(q * last)))]


@dataclass(frozen=True, slots=True)
class ProxyFilter:
    proto: str | None = None
    country: tuple[str, ...] | None = None  # any of these ISO codes
    asn: int | None = None
    as_org: str | None = None
    anonymity: str | None = None
    max_latency_ms: float | None = None
    status: str = "alive"  # alive, suspect, unconfirmed, stale, dead, all
    fresh_s: int | None = None
    mitm: bool | None = None
    https: bool | None = None  # True: tunnelled to a real HTTPS target; False: not (yet)
    works_on: tuple[str, ...] | None = None  # sites it gets through to, each of them
    # Quality signals (projections/core/quality.py): up at least this share (0-1) of
    # the known time of the last days; working without a break for this long; a
    # download at least this fast; its address in a datacenter ("yes") or not ("no").
    min_uptime: float | None = None
    stable_for_s: int | None = None
    min_speed_kb_s: int | None = None
    datacenter: str | None = None

    @property
    def quality(self) -> bool:
        """Whether it asks for any of the signals a proxy's checks give."""
        asked = (self.min_uptime, self.stable_for_s)
        return any(a is not None for a in asked) or bool(self.min_speed_kb_s)

    def quality_ok(self, q: ProxyQuality | None, now: int) -> bool:
        """Whether the figures of ``q`` (a proxy's, None: none yet) meet it at ``now``."""
        if self.min_uptime is not None:
            share = uptime(q, now)
            if share is None or share < self.min_uptime:
                return False
        if self.stable_for_s is not None:
            since = stable_since(q)
            if not since or now - since < self.stable_for_s * 1000:
                return False
        return not self.min_speed_kb_s or (q is not None and q.speed_kb_s >= self.min_speed_kb_s)


def _matches(
    row: ProxyRow,
    f: ProxyFilter,
    now: int,
    ttl_s: int,
    vouched: Callable[[tuple[str, ...]], bool],
    state: State,
) -> bool:
    if f.proto is not None and f.proto not in row.protos:
        return False
    if f.anonymity is not None and row.anonymity != f.anonymity:
        return False
    if f.country is not None and row.country not in f.country:
        return False
    if f.as_org is not None and row.as_org != f.as_org:
        return False
    if f.asn is not None and row.asn != f.asn:
        return False
    if f.max_latency_ms is not None and row.latency_ema > f.max_latency_ms:
        return False
    if f.mitm is not None and row.mitm != f.mitm:
        return False
    if f.https is not None and (row.https == "yes") != f.https:
        return False
    if f.fresh_s is not None and now - row.last_seen > f.fresh_s * 1000:
        return False
    if f.works_on is not None and not all(
        sites.standing(state, (row.ip, row.port), site, now) == THROUGH for site in f.works_on
    ):
        return False
    if f.datacenter is not None and datacenter(row.as_org) != f.datacenter:
        return False
    if f.quality and not f.quality_ok(state.quality.get((row.ip, row.port)), now):
        return False
    return f.status == "all" or proxy_status(row, now, ttl_s, vouched(row.agents)) == f.status


def query_proxies(
    state: State,
    now: int,
    f: ProxyFilter,
    *,
    ttl_s: int | None = None,
    sort: str = "latency",
    limit: int = 100,
) -> list[ProxyRow]:
    ttl = state.settings.proxy_ttl_s if ttl_s is None else ttl_s
    vouched = trust.vouched(state)
    rows: Iterator[ProxyRow] = (
        row for row in state.proxies.values() if _matches(row, f, now, ttl, vouched, state)
    )
    if sort == "last_seen":
        ordered = sorted(rows, key=lambda r: (-r.last_seen, r.ip, r.port))
    else:
        ordered = sorted(rows, key=lambda r: (r.latency_ema, r.ip, r.port))
    return ordered[:limit] if limit else ordered


class SiteTally:
    """Per site, what its cells say at ``now`` (reducers/sites.py): proxies through,
    turned away and unknown, the answers of each kind, the vantages that saw them, and
    the answers this hour of log time from probes and from traffic (``hourly``).
    Fed in parts (``add``), so a caller may give the loop back between them."""

    def __init__(self, now: int, hourly: dict[str, list[int]] | None = None) -> None:
        self.now = now
        self.hourly = hourly or {}  # State.site_hour
        self.by: dict[str, dict[str, int]] = {}
        self.vantages: dict[str, set[str]] = {}

    def add(self, rows: Iterable[SiteCells]) -> None:
        for cells in rows:
            counts = self.by.get(cells.site)
            if counts is None:
                counts = self.by[cells.site] = dict.fromkeys(_TALLIED, 0)
            through, blocked = sites.tally(cells, self.now)
            counts["through"] += through
            counts["blocked"] += blocked
            counts["none"] += len(cells.nos) - through - blocked
            counts["answers_through"] += sum(cells.through)
            counts["answers_blocked"] += sum(cells.blocked)
            seen = {cells.agents[code - 1] for code in set(cells.vantages) if code}
            self.vantages.setdefault(cells.site, set()).update(seen)

    def answer(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for site in sorted(self.by, key=lambda s: (-self.by[s]["through"], s)):
            counts = self.by[site]
            judged = counts["through"] + counts["blocked"]
            share = round(counts["blocked"] / judged, 3) if judged else None
            vantages = len(self.vantages.get(site, ()))
            hour, probes, traffic = self.hourly.get(site, (0, 0, 0))
            if hour != self.now // 3_600_000:
                probes = traffic = 0
            out.append(
                {"site": site, **counts, "turned_away_share": share, "vantages": vantages,
                 "probes_this_hour": probes, "traffic_this_hour": traffic}
            )  # fmt: skip
        return out


_TALLIED = ("through", "blocked", "none", "answers_through", "answers_blocked")
