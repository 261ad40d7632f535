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
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from projections.core.census import CENSUS_MS, STEP, Tally, edge
from projections.core.chunks import Chunks
from projections.core.proxyview import ProxyView, Views, view_of
from projections.core.readmodels import ProxyFilter
from projections.core.through import ThroughKept
from reducers import State, trust
from reducers.pool import FRESH_STATUSES, fresh_status, seen_bounds
from reducers.state import ProxyKey
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

Index = dict[object, Views]
_NONE: Views = Chunks()
INDEXED = ("proto", "anonymity", "country", "asn")  # the order _indexing walks them in


def _fresh_terms(status: str) -> tuple[bool | None, bool | None]:
    """(failing, confirmed) a row within the TTL needs for ``fresh_status`` to say ``status``
    with mitm apart (None: either), found by asking ``fresh_status`` itself, so a scan
    tests two fields a row rather than calling it."""
    cases = [
        (f, c) for f in (False, True) for c in (False, True) if fresh_status(f, c, False) == status
    ]
    failing = {f for f, _ in cases}
    confirmed = {c for _, c in cases}
    if len(cases) != len(failing) * len(confirmed):
        raise AssertionError(f"status {status} is not a pair of conditions")
    return (
        failing.pop() if len(failing) == 1 else None,
        confirmed.pop() if len(confirmed) == 1 else None,
    )


_FRESH_TERMS = {s: _fresh_terms(s) for s in FRESH_STATUSES if s != "mitm"}


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
    # Each row's view by its key: what the next view, built from the rows that changed
    # (``building``'s ``since``), starts from.
    by_key: dict[ProxyKey, ProxyView] = field(default_factory=dict)

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
            yield from tally.moving(self.by_last_seen, edge(self.by_last_seen, at, self.ttl_s))
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
        failing, confirmed = _FRESH_TERMS.get(f.status, (None, None))
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


Building = Generator[None, None, PoolView]


_NO_ONE: set[ProxyKey] = set()


def build(state: State) -> PoolView:
    """The pool view of ``state`` at once (tests, replays; the gateway drives ``building``)."""
    return at_once(building(state))


def building(
    state: State,
    now: int | None = None,
    kept: ThroughKept | None = None,
    since: PoolView | None = None,
    changed: Iterable[ProxyKey] = (),
) -> Building:
    """The pool view of ``state``, built a step of at most ``STEP`` rows at a time: the
    caller (gateway/views.py) gives the event loop back between steps, so a pool of a
    million rows never holds it for the second its view takes. Each row is copied
    whole within one step; rows the fold changes between steps are copied as they are
    then (the view's ``seq`` is where it started), and rows it adds wait for the next
    view. With ``now``, the census at ``now`` is counted as a last step, and the sites'
    standing is as of ``now`` (without: as of the latest words, no block expired);
    ``kept``: what the last views found of the sites, for the rows that did not move.

    ``since``: a view of the same state, built under the same trust and settings, and
    ``changed``: every key whose row changed since it was built (``State.view_changes``):
    only those rows are copied again, and the orders are the old ones with them taken
    out and merged back in (``_merging``), not sorted anew: a burst of 30,000 new
    proxies into a pool of 100,000 is a view in a fraction of a whole build."""
    vouched = trust.vouched(state)
    seq, ttl_s = state.last_seq, state.settings.proxy_ttl_s
    if since is None:
        by_key: dict[ProxyKey, ProxyView] = {}
        keys, rows = list(state.proxies), list(state.proxies.values())
        views: list[tuple[ProxyView, ...]] = []  # a step's each
        for i in range(0, len(rows), STEP):
            part = tuple(view_of(r, vouched, state.quality) for r in rows[i : i + STEP])
            by_key.update(zip(keys[i : i + STEP], part, strict=True))
            views.append(part)
            yield
        del keys, rows
        by_latency = yield from _sorting(views, _by_latency)
        by_last_seen = yield from _sorting(views, _by_last_seen)
        indexes = yield from _indexing(by_latency)
        tally = Tally()
    else:
        by_key, fresh, gone = yield from _changing(state, since.by_key, changed, vouched)
        ids = {id(v) for v in gone}
        by_latency = yield from _merging(since.by_latency, ids, fresh, _by_latency)
        by_last_seen = yield from _merging(since.by_last_seen, ids, fresh, _by_last_seen)
        indexes = (yield from _indexing(by_latency)) if fresh or gone else since.indexes
        tally = since.tally.carried(gone, fresh, by_last_seen, ttl_s)
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
    view = PoolView(seq, ttl_s, by_latency, by_last_seen, indexes, through, tally, by_key)
    if now is not None:
        yield from view.counting(now)  # the one full walk, here rather than on a request
    return view


def _changing(
    state: State,
    before: dict[ProxyKey, ProxyView],
    changed: Iterable[ProxyKey],
    vouched: Callable[[tuple[str, ...]], bool],
) -> Generator[None, None, tuple[dict[ProxyKey, ProxyView], list[ProxyView], list[ProxyView]]]:
    """The views by key with the ``changed`` rows copied anew (those gone, left out);
    the new views, and the old ones they replace."""
    by_key = dict(before)
    fresh: list[ProxyView] = []
    gone: list[ProxyView] = []
    keys = list(changed)
    for i in range(0, len(keys), STEP):
        for key in keys[i : i + STEP]:
            old = by_key.pop(key, None)
            if old is not None:
                gone.append(old)
            row = state.proxies.get(key)
            if row is not None:
                view = by_key[key] = view_of(row, vouched, state.quality)
                fresh.append(view)
        yield
    return by_key, fresh, gone


def _merging(
    before: Views, gone: set[int], fresh: list[ProxyView], key: Callable[[ProxyView], Any]
) -> Generator[None, None, Views]:
    """``before``'s order without the views of ``gone`` and with ``fresh`` merged in,
    ``STEP`` at a time: the old order is one sorted run already."""
    if not (gone or fresh):
        return before
    parts = [tuple(fresh[i : i + STEP]) for i in range(0, len(fresh), STEP)]
    added = yield from _sorting(parts, key)
    staying = (v for v in before if id(v) not in gone)
    merged = heapq.merge(staying, added, key=key)
    out = []
    while chunk := tuple(islice(merged, STEP)):
        out.append(chunk)
        yield
    return Chunks(out)


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


def _indexing(views: Views) -> Generator[None, None, dict[str, Index]]:
    """The views by each value of proto, anonymity, country and ASN, each value's in
    the order of ``views``: one walk, a step's part of it at a time, a tuple for each
    value a part holds."""
    groups: dict[str, dict[object, list[tuple[ProxyView, ...]]]] = {k: {} for k in INDEXED}
    # A quarter of a step's rows a step: each row goes into four indexes (and the young
    # tuples a step leaves are what a young collection walks, projections/core/chunks.py).
    quarter = STEP // len(INDEXED)
    for rows in (islice(p, i, i + quarter) for p in views.parts for i in range(0, len(p), quarter)):
        found: dict[str, defaultdict[object, list[ProxyView]]] = {
            k: defaultdict(list) for k in INDEXED
        }
        protos, anonymity, country, asn = found.values()
        for v in rows:
            for p in v.protos:
                protos[p].append(v)
            anonymity[v.anonymity].append(v)
            country[v.country].append(v)
            asn[v.asn].append(v)
        for key, by_value in found.items():
            group = groups[key]
            for value, vs in by_value.items():
                group.setdefault(value, []).append(tuple(vs))
        yield
    indexes: dict[str, Index] = {}
    made = 0
    for key, group in groups.items():
        index: Index = {}
        indexes[key] = index
        for value, parts in group.items():  # about STEP parts a step (a value's all in one)
            index[value] = Chunks(parts)
            made += len(parts)
            if made >= STEP:
                made = 0
                yield
    return indexes


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
