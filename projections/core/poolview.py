"""The pool view: an immutable copy of the proxy pool that queries read, swapped whole.

Rows in the live state are mutated by the fold; a query reads a view instead: views
copied from the rows at one applied sequence, pre-sorted by latency and by last seen
(each order and index held in parts of at most a step's views,
``projections/core/chunks.py``), and the text lines
of ``format=txt`` pre-rendered. A new view replaces the old one in a single
assignment, so a reader sees one sequence or the next, never half.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import msgspec

from projections.core.chunks import Chunks
from projections.core.quality import datacenter
from projections.core.readmodels import ProxyFilter
from reducers import State, sites, trust
from reducers.pool import STANDINGS, band_edges, seen_bounds, standing
from reducers.rows import ProxyQuality, SiteCells
from reducers.state import ProxyKey, ProxyRow
from reducers.steps import at_once

__all__ = [
    "CENSUS_MS",
    "PoolView",
    "ProxyView",
    "ThroughKept",
    "build",
    "building",
    "dropping",
    "held",
]

CENSUS_MS = 5_000


class ProxyView(msgspec.Struct, gc=False):
    """One row as a query reads it, copied whole. Untracked by the collector (``gc=False``:
    it holds no container that could hold it back), so a view's hundred thousand views
    cost no collection a walk; built by msgspec in C, not by a Python ``__new__``."""

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
    datacenter: str  # "yes", "no", "" (no AS known): projections/core/quality.py
    # Its figures over time (reducers/quality.py): the fold's own row, read only where a
    # filter or an answer asks (as of the read, not the build). Working them out for
    # every row made a build of 100,000 proxies 0.50 s (0.34 without figures; 0.375
    # reading them so).
    quality: ProxyQuality | None = None


Views = Chunks[ProxyView]
Index = dict[object, Views]
_NONE: Views = Chunks()


def _standing_terms(status: str) -> tuple[bool | None, bool | None]:
    """(failing, confirmed) a row within the TTL needs for ``standing`` to say ``status``
    with mitm apart (None: either), found by asking ``standing`` itself, so a scan
    tests two fields a row rather than calling it."""
    cases = [
        (f, c) for f in (False, True) for c in (False, True) if standing(f, c, False) == status
    ]
    failing = {f for f, _ in cases}
    confirmed = {c for _, c in cases}
    if len(cases) != len(failing) * len(confirmed):
        raise AssertionError(f"status {status} is not a pair of conditions")
    return (
        failing.pop() if len(failing) == 1 else None,
        confirmed.pop() if len(confirmed) == 1 else None,
    )


_STANDING_TERMS = {s: _standing_terms(s) for s in STANDINGS if s != "mitm"}
_BY = (("by_proto", "proto"), ("by_anonymity", "anonymity"), ("by_country", "country"))


def _line(v: ProxyView) -> str:
    """The census line of a row within the TTL."""
    return standing(v.fail_streak > 0, v.confirmed, v.mitm)


@dataclass(slots=True)
class Tally:
    """Counts of the rows ``by_last_seen[:edge]``: moving the edge adds or takes away only
    the rows between the old edge and the new one (a few, as the TTL's edge moves in
    real time), so a census costs a full walk once a view, not once a slice."""

    edge: int = 0
    at: int = -1
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STANDINGS, 0))
    by: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {} for k, _ in _BY})
    answer: dict[str, Any] | None = None

    def moving(self, rows: Views, edge: int) -> Generator[None, None, None]:
        """Move the edge to ``edge``, ``STEP`` rows a step."""
        while self.edge != edge:
            step = max(-STEP, min(STEP, edge - self.edge))
            lo, hi = sorted((self.edge, self.edge + step))
            self._count(rows.between(lo, hi), 1 if step > 0 else -1)
            self.edge += step
            yield

    def _count(self, rows: Iterable[ProxyView], sign: int) -> None:
        counts, by = self.counts, self.by
        for v in rows:
            line = _line(v)
            counts[line] += sign
            if line != "alive":
                continue
            for name, attr in _BY:
                d = by[name]
                value = getattr(v, attr) if attr == "proto" else getattr(v, attr) or "unknown"
                left = d.get(value, 0) + sign
                if left:
                    d[value] = left
                else:
                    del d[value]

    def answer_counts(self) -> dict[str, Any]:
        return {**self.counts, **{k: dict(sorted(d.items())) for k, d in self.by.items()}}


@dataclass(frozen=True, slots=True)
class PoolView:
    seq: int
    ttl_s: int
    by_latency: Views
    by_last_seen: Views
    # Views by proto, anonymity, country and ASN, each sorted by latency: a selective
    # filter scans its own short list instead of the whole pool.
    indexes: dict[str, Index]
    # Per site, the proxies that get through to it (reducers/sites.py ``standing``) as of
    # the build: a set of the keys the fold's index holds already, not a copy of the
    # cells (at 100,000 proxies and 200 sites the copy took 330 MB).
    through: dict[str, set[ProxyKey]] = field(default_factory=dict)
    # The census's running tally (``Tally``): what the walk of by_last_seen counted down
    # to the TTL's edge it was last asked at, moved from there as the edge moves.
    tally: Tally = field(default_factory=lambda: Tally())

    def census(self, now: int) -> dict[str, Any]:
        """The pool within the TTL as ``GET /v1/proxies`` sees it: ``alive`` is what it
        serves by default (confirmed by an agent trusted now, latest check not failed,
        never seen tampering), by protocol, anonymity and country; ``unconfirmed``,
        ``suspect`` and ``mitm`` on their own lines. Counted for a ``CENSUS_MS`` slice of
        time; a later slice walks only the rows that crossed the TTL's edge since."""
        for _ in self.counting(now):
            pass
        assert self.tally.answer is not None
        return self.tally.answer

    def counting(self, now: int) -> Generator[None, None, None]:
        """``census(now)`` a step at a time (a new view's first census walks it all)."""
        at = now // CENSUS_MS
        tally = self.tally
        if tally.at != at:
            alive_from, _ = band_edges(at * CENSUS_MS, self.ttl_s)
            # by_last_seen is newest first: the rows within the TTL are a prefix of it.
            edge = self.by_last_seen.bisect_right(-alive_from, key=_newest_first)
            yield from tally.moving(self.by_last_seen, edge)
            tally.at, tally.answer = at, None
        if tally.answer is None:
            tally.answer = {"seq": self.seq, **tally.answer_counts()}

    def _base(self, f: ProxyFilter) -> Views | None:
        one_country = f.country[0] if f.country is not None and len(f.country) == 1 else None
        keys = {"proto": f.proto, "anonymity": f.anonymity, "country": one_country, "asn": f.asn}
        lists = [self.indexes[k].get(v, _NONE) for k, v in keys.items() if v is not None]
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
        self, rows: Views, f: ProxyFilter, now: int, sort: str, limit: int
    ) -> Iterator[ProxyView]:
        oldest, newest = seen_bounds(f.status, now, self.ttl_s)
        failing, confirmed = _STANDING_TERMS.get(f.status, (None, None))
        fresh = now - f.fresh_s * 1000 if f.fresh_s is not None else None
        works = [self.through.get(site, _NO_ONE) for site in f.works_on or ()]
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
            if works and not all((v.ip, v.port) in through for through in works):
                continue
            if f.quality and not f.quality_ok(v.quality, now):
                continue
            if f.datacenter is not None and v.datacenter != f.datacenter:
                continue
            yield v
            taken += 1
            if taken == limit:
                return


def _by_latency(v: ProxyView) -> tuple[float, str, int]:
    return (v.latency, v.ip, v.port)


def _by_last_seen(v: ProxyView) -> tuple[int, str, int]:
    return (-v.last_seen, v.ip, v.port)


def _newest_first(v: ProxyView) -> int:
    return -v.last_seen


# Rows a step of ``building``: at most ~2.5 ms of this machine's time for any kind of step.
STEP = 1_024

Building = Generator[None, None, PoolView]


_NO_ONE: set[ProxyKey] = set()


class ThroughKept:
    """What the pool views found of the sites, kept from one view to the next (the
    gateway's keeper holds one): a row of cells whose columns are the bytes they were,
    read before the earliest lifting of a block in it, gets the same proxies through;
    a site whose rows all did gets the same set. Walking 2,000,000 cells anew was 0.4
    s of each view's build (1.05 s against 0.65 without cells), and a request waits on
    a build's slices while it runs."""

    def __init__(self) -> None:
        # (site, chunk, as of a time or not) -> (its columns' bytes, until, the proxies)
        self._rows: dict[tuple[str, int, bool], tuple[bytes, int, list[ProxyKey]]] = {}
        self._sites: dict[str, tuple[list[list[ProxyKey]], set[ProxyKey]]] = {}

    def row(
        self, cells: SiteCells, now: int, proxy_of: dict[int, ProxyKey]
    ) -> tuple[list[ProxyKey], bool]:
        """(the proxies of ``cells`` through at ``now``, whether they were walked)."""
        key = (cells.site, cells.chunk, now > 0)
        columns = b"".join((cells.nos, cells.through_at, cells.blocked_at))
        held = self._rows.get(key)
        if held is not None and held[0] == columns and now < held[1]:
            return held[2], False
        found, until = sites.through_until(cells, now, proxy_of)
        self._rows[key] = (columns, until, found)
        return found, True

    def union(self, site: str, founds: list[list[ProxyKey]]) -> set[ProxyKey]:
        """The proxies of ``founds`` as one set: the last one made for ``site`` when
        they are the very lists it was made of."""
        made_of, union = self._sites.get(site, ([], set()))
        if made_of and len(made_of) == len(founds) and all(map(operator.is_, made_of, founds)):
            return union
        union = set().union(*founds)
        self._sites[site] = (founds, union)
        return union

    def forget(self, sites_through: Iterable[str], rows: Iterable[tuple[str, int]]) -> None:
        """Let go of what was kept of the sites with no proxy through any more, and of
        the rows gone."""
        keep = set(sites_through)
        self._sites = {s: v for s, v in self._sites.items() if s in keep}
        present = set(rows)
        self._rows = {k: v for k, v in self._rows.items() if k[:2] in present}


def build(state: State) -> PoolView:
    """The pool view of ``state`` at once (tests, replays; the gateway drives ``building``)."""
    return at_once(building(state))


def building(state: State, now: int | None = None, kept: ThroughKept | None = None) -> Building:
    """The pool view of ``state``, built a step of at most ``STEP`` rows at a time: the
    caller (gateway/queries.py) gives the event loop back between steps, so a pool of a
    million rows never holds it for the second its view takes. Each row is copied
    whole within one step; rows the fold changes between steps are copied as they are
    then (the view's ``seq`` is where it started), and rows it adds wait for the next
    view. With ``now``, the census at ``now`` is counted as a last step, and the sites'
    standing is as of ``now`` (without: as of the latest words, no block expired);
    ``kept``: what the last views found of the sites, for the rows that did not move."""
    vouched = trust.vouched(state)
    seq, ttl_s = state.last_seq, state.settings.proxy_ttl_s
    rows = list(state.proxies.values())
    views: list[tuple[ProxyView, ...]] = []  # a step's each
    for i in range(0, len(rows), STEP):
        views.append(tuple(_view(r, vouched, state.quality) for r in rows[i : i + STEP]))
        yield
    del rows
    by_latency = yield from _sorting(views, _by_latency)
    by_last_seen = yield from _sorting(views, _by_last_seen)
    indexes = {}
    for key in ("proto", "anonymity", "country", "asn"):
        indexes[key] = yield from _indexing(by_latency, key)
    kept = kept if kept is not None else ThroughKept()
    founds: dict[str, list[list[ProxyKey]]] = {}
    walked = 0
    for cells in list(state.sites.values()):
        found, moved = kept.row(cells, now or 0, state.site_proxy)
        if found:
            founds.setdefault(cells.site, []).append(found)
        walked += len(cells.nos) if moved else len(cells.nos) // 64
        if walked >= STEP:
            walked = 0
            yield
    through = {}
    for site, lists in founds.items():
        through[site] = kept.union(site, lists)
        yield
    kept.forget(founds.keys(), state.sites.keys())
    view = PoolView(seq, ttl_s, by_latency, by_last_seen, indexes, through)
    if now is not None:
        yield from view.counting(now)  # the one full walk, here rather than on a request
    return view


def _view(
    r: ProxyRow,
    vouched: Callable[[tuple[str, ...]], bool],
    quality: dict[ProxyKey, ProxyQuality],
) -> ProxyView:
    return ProxyView(
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
        datacenter(r.as_org),
        quality.get((r.ip, r.port)) if quality else None,
    )


def _sorting(
    views: list[tuple[ProxyView, ...]], key: Callable[[ProxyView], tuple[Any, ...]]
) -> Generator[None, None, Views]:
    """``sorted(views, key=key)`` in steps: each part sorted a step, then merged ``STEP``
    at a time (keys are unique: ip and port end every key)."""
    runs = []
    for part in views:
        runs.append(sorted(part, key=key))
        yield
    merged = heapq.merge(*runs, key=key)
    out = []
    while chunk := tuple(islice(merged, STEP)):
        out.append(chunk)
        yield
    return Chunks(out)


def _indexing(views: Views, key: str) -> Generator[None, None, Index]:
    """The views by the values of ``key``, each value's in the order of ``views``: a
    step's part of it at a time, a tuple for each value it holds."""
    groups: dict[object, list[tuple[ProxyView, ...]]] = {}
    for part in views.parts:
        found: dict[object, list[ProxyView]] = {}
        if key == "proto":
            for v in part:
                for p in v.protos:
                    found.setdefault(p, []).append(v)
        else:
            for v in part:
                found.setdefault(getattr(v, key), []).append(v)
        for k, vs in found.items():
            groups.setdefault(k, []).append(tuple(vs))
        yield
    index: Index = {}
    made = 0
    for k, parts in groups.items():  # about STEP parts a step (a value's all in one)
        index[k] = Chunks(parts)
        made += len(parts)
        if made >= STEP:
            made = 0
            yield
    return index


def held(view: PoolView) -> list[tuple[tuple[ProxyView, ...], ...]]:
    """What holds ``view``'s views: the parts of each of its orders and index values, a
    tuple of them each (one reference a sequence, so the list stays short)."""
    indexed = (c.parts for index in view.indexes.values() for c in index.values())
    return [view.by_latency.parts, view.by_last_seen.parts, *indexed]


def dropping(holding: list[tuple[tuple[ProxyView, ...], ...]]) -> Generator[None, None, None]:
    """Let go of a retired view's views (``holding``, from ``held``, is what is left
    holding them), about ``STEP`` references a step: a sequence's parts are taken out
    of their tuple into a list first, so no step frees a whole order at once."""
    parts: list[tuple[ProxyView, ...]] = []
    while holding or parts:
        let_go = 0
        while let_go < STEP and (holding or parts):
            if parts:
                let_go += len(parts.pop())
            else:
                parts = list(holding.pop())
                let_go += len(parts)
        yield
