"""Per-site standing: which proxies get through to which site, from the fleet's verdicts.

A cell per proxy and site with evidence: when an answer last got through and when one
was last turned away, how many of each, and from which vantages (at most
``MAX_VANTAGES`` agents). Only an agent trusted at the time moves the times
(reducers/trust.py: an untested agent's verdicts are counted and steer no one); with
trust off, every agent. A cell lives as long as its proxy. A site holds at most
``MAX_CELLS`` cells and the table at most ``MAX_SITES`` sites: past them a verdict is
counted as not kept (``State.sites_unkept``), first come first kept, so every replica
keeps the same cells; with ``Settings.site_cells_guarded``, an agent not trusted then
opens no cell but on the operator's targets (its verdicts elsewhere count on cells kept
already). With ``Settings.site_eviction``, a new site finds room in a full table by
evicting the lowest ranked site when it outranks it (``_rank``: the operator's targets,
then the latest traffic, then the latest verdict, in log time, ties by name): the same
on every replica, and a flood of invented sites evicts only sites nobody's traffic went
to lately, never a target.
A block is never the proxy's failure: nothing here touches its row.

Kept in columns, 34 bytes a cell (reducers/rows.py ``SiteCells``): a proxy's first cell
gives it a number (``SiteProxy``, from ``State.next_site_no``, never given again), and
a site's cells are rows of ``CHUNK`` numbers each, a column a field, a cell an index in
number order (a row keeps each number's place in its run, ``no % CHUNK``). A snapshot
restores the columns as the bytes they were written; a
checkpoint rewrites the rows its verdicts touched, not the site.

Reading (``standing``): through while the latest answer through is newer than the latest
block, or the block is older than ``BLOCK_KEEP_MS``; turned away while a block is newer
and recent; else unknown. Pure, deterministic: log time only.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import NamedTuple

from events.catalogue import ProxyReported, SitesChecked
from events.sites import BLOCKED, NONE, THROUGH
from reducers.rows import (
    MAX_UINT32,
    MAX_VANTAGES,
    ProxyKey,
    SiteCells,
    SiteKey,
    SiteProxy,
    Take,
    UInt16s,
)
from reducers.state import State

__all__ = [
    "BLOCK_KEEP_MS",
    "CHUNK",
    "MAX_CELLS",
    "MAX_SITES",
    "MAX_UNTIL",
    "MAX_VANTAGES",
    "Cell",
    "cell",
    "checked",
    "forget",
    "heard_at",
    "keys",
    "latest_counts",
    "moved",
    "reindex",
    "reported",
    "standing",
    "standing_at",
    "tally",
    "through_until",
]

MAX_SITES = 256
MAX_CELLS = 10_000  # per site: 200 sites' worth stay within the gateway's budget
BLOCK_KEEP_MS = 6 * 3_600_000  # a site's block of an exit is lifted in hours, not days
# Proxy numbers a row of cells covers: what a checkpoint rewrites at once (at most 65,536:
# a number's place in its row is a 16-bit column).
CHUNK = 1_024
_TAKES = 4_096  # consumers' hourly takes per site kept before past hours' are let go
_NO_VANTAGES = UInt16s([0] * MAX_VANTAGES)
_MAX_AGENTS = 0xFFFF  # the agents a row of cells can name (a vantage is a 16-bit code)


def checked(state: State, batch: SitesChecked, ts: int) -> None:
    """Fold one round of verdicts; results on proxies the pool does not know, and new
    cells past the caps, are counted and not kept."""
    steers = not state.settings.trust or batch.agent in state.trusted
    agent = state.agents.get(batch.agent)
    traffic = agent is not None and agent.role == "endpoint"
    hour = ts // 3_600_000
    # Settings.site_cells_guarded: an agent not trusted then opens no cell but on a target.
    opens = steers or not state.settings.site_cells_guarded
    for r in batch.results:
        if traffic and steers:
            _traffic_went_to(state, r.site, ts)
        _answered(state, r.site, hour, r.through + r.blocked, traffic)
        if opens or r.site in state.site_rules:
            found = _cell(state, r.ip, r.port, r.site, ts)
        elif (found := _found(state, (r.ip, r.port), r.site)) is None:
            state.sites_unkept += 1
        if found is None:
            continue
        cells, i = found
        cells.through[i] = min(cells.through[i] + r.through, MAX_UINT32)
        cells.blocked[i] = min(cells.blocked[i] + r.blocked, MAX_UINT32)
        if steers and (r.through or r.blocked):
            before = _latest(cells, i)
            # Both in one round: the more frequent answer is the latest word.
            if r.through > r.blocked:
                cells.through_at[i] = ts
            else:
                cells.blocked_at[i] = ts
            cells.last_at = max(cells.last_at, ts)
            state.site_seen[cells.site] = max(state.site_seen.get(cells.site, 0), ts)
            _move(cells, before, _latest(cells, i))
        _saw(cells, i, batch.agent)
        state.dirty["sites"].add((cells.site, cells.chunk))


def reported(state: State, event: ProxyReported, ts: int) -> None:
    """A consumer's word that ``event.site`` turned a proxy away. It counts; it steers
    for everyone when the consumer is trusted (or trust is off), else only within
    ``report_share`` of the site's cells an hour (at least one), so one token cannot
    turn a site's pool away. A consumer's word that a proxy works never steers."""
    found = _cell(state, event.ip, event.port, event.site, ts)
    if found is None:
        return
    cells, i = found
    cells.blocked[i] = min(cells.blocked[i] + 1, MAX_UINT32)
    if not state.settings.trust or event.agent in state.trusted or _take(state, event, ts):
        before = _latest(cells, i)
        cells.blocked_at[i] = ts
        cells.last_at = max(cells.last_at, ts)
        state.site_seen[cells.site] = max(state.site_seen.get(cells.site, 0), ts)
        _move(cells, before, _latest(cells, i))
    state.dirty["sites"].add((cells.site, cells.chunk))
    state.settings_dirty = True  # meta holds the takes


def _cell(state: State, ip: str, port: int, site: str, ts: int) -> tuple[SiteCells, int] | None:
    """The row of the cell of (``ip``, ``port``) and ``site`` and its index there, the
    cell made when its proxy is known and the caps leave room; None (counted as not
    kept) else."""
    proxy = (ip, port)
    found = _found(state, proxy, site)
    if found is not None:
        return found
    if proxy not in state.proxies or not _room(state, site, ts):
        state.sites_unkept += 1
        return None
    number = state.site_proxies.get(proxy)
    if number is None:
        number = state.site_proxies[proxy] = SiteProxy(ip, port, state.next_site_no)
        state.next_site_no += 1
        state.site_proxy[number.no] = proxy
        state.dirty["site_proxies"].add(proxy)
    chunk = number.no // CHUNK
    cells = state.sites.get((site, chunk))
    if cells is None:
        cells = state.sites[(site, chunk)] = SiteCells(site=site, chunk=chunk)
    i, _ = _index(cells, number.no)
    cells.nos.insert(i, number.no % CHUNK)
    for column in (cells.through_at, cells.blocked_at, cells.through, cells.blocked):
        column.insert(i, 0)
    cells.vantages[i * MAX_VANTAGES : i * MAX_VANTAGES] = _NO_VANTAGES
    state.site_cells[site] = state.site_cells.get(site, 0) + 1
    return cells, i


def _saw(cells: SiteCells, i: int, agent: str) -> None:
    """``agent`` among the cell's vantages, while it has fewer than ``MAX_VANTAGES``."""
    base = i * MAX_VANTAGES
    codes = cells.vantages[base : base + MAX_VANTAGES]
    code = cells.agents.index(agent) + 1 if agent in cells.agents else 0
    if (code and code in codes) or 0 not in codes:
        return
    if not code:
        if len(cells.agents) >= _MAX_AGENTS:
            return
        cells.agents.append(agent)
        code = len(cells.agents)
    cells.vantages[base + codes.index(0)] = code


def _drop(cells: SiteCells, i: int) -> None:
    for column in (cells.nos, cells.through_at, cells.blocked_at, cells.through, cells.blocked):
        del column[i]
    del cells.vantages[i * MAX_VANTAGES : (i + 1) * MAX_VANTAGES]


def _take(state: State, event: ProxyReported, ts: int) -> bool:
    """Whether an untrusted consumer's block report may act this hour (of log time).
    Past ``_TAKES`` entries, those of past hours are let go first."""
    name, hour = f"{event.agent} {event.site}", ts // 3_600_000
    take = state.site_takes.get(name)
    if take is None and len(state.site_takes) >= _TAKES:
        state.site_takes = {k: t for k, t in state.site_takes.items() if t.hour == hour}
    if take is None or take.hour != hour:
        cells = state.site_cells.get(event.site, 0)
        take = state.site_takes[name] = Take(
            hour, 0, max(1, int(state.settings.report_share * cells))
        )
    if take.taken >= take.cap:
        return False
    take.taken += 1
    return True


def _answered(state: State, site: str, hour: int, answers: int, traffic: bool) -> None:
    """Count ``answers`` to ``site`` this hour, the traffic's or the probes'."""
    counts = state.site_hour.get(site)
    if counts is None or counts[0] != hour:
        if counts is None and len(state.site_hour) >= 2 * MAX_SITES:
            state.site_hour = {s: c for s, c in state.site_hour.items() if c[0] == hour}
            if len(state.site_hour) >= 2 * MAX_SITES:
                return  # this hour's sites fill it: counted no further
        counts = state.site_hour[site] = [hour, 0, 0]
    counts[2 if traffic else 1] += answers


def _traffic_went_to(state: State, site: str, ts: int) -> None:
    """``site`` among the sites of traffic at ``ts``; past ``MAX_SITES`` of them, the one
    whose traffic is oldest makes room (ties by name)."""
    if site not in state.site_traffic and len(state.site_traffic) >= MAX_SITES:
        oldest = min(state.site_traffic.items(), key=lambda kv: (kv[1], kv[0]))[0]
        del state.site_traffic[oldest]
    state.site_traffic[site] = ts
    state.settings_dirty = True  # meta holds the sites of traffic


def _room(state: State, site: str, ts: int) -> bool:
    cells = state.site_cells.get(site)
    if cells is not None:
        return cells < MAX_CELLS
    if len(state.site_cells) < MAX_SITES:
        return True
    if not state.settings.site_eviction:
        return False
    lowest = min(state.site_cells, key=lambda s: _rank(state, s, state.site_seen.get(s, 0)))
    if _rank(state, lowest, state.site_seen.get(lowest, 0)) >= _rank(state, site, ts):
        return False
    _evict(state, lowest)
    return True


def _rank(state: State, site: str, seen: int) -> tuple[bool, int, int, str]:
    """Which sites keep their room: the operator's targets, then the latest traffic to
    them, then their latest verdict (``seen``), in log time; ties by name."""
    return site in state.site_rules, state.site_traffic.get(site, 0), seen, site


def _evict(state: State, site: str) -> None:
    """Every cell of ``site`` let go (counted as not kept), its rows deleted at the next
    checkpoint."""
    for chunk in range(state.next_site_no // CHUNK + 1):
        if state.sites.pop((site, chunk), None) is not None:
            state.dirty["sites"].add((site, chunk))
    state.sites_unkept += state.site_cells.pop(site)
    state.site_seen.pop(site, None)


def forget(state: State, proxy: ProxyKey) -> None:
    """The proxy left the pool: its cells go with it, and its number."""
    number = state.site_proxies.pop(proxy, None)
    if number is None:
        return
    del state.site_proxy[number.no]
    state.dirty["site_proxies"].add(proxy)
    chunk = number.no // CHUNK
    for site in list(state.site_cells):
        cells = state.sites.get((site, chunk))
        if cells is None:
            continue
        i, there = _index(cells, number.no)
        if not there:
            continue
        _move(cells, _latest(cells, i), NONE)
        _drop(cells, i)
        state.dirty["sites"].add((site, chunk))
        if not cells.nos:
            del state.sites[(site, chunk)]
        left = state.site_cells[site] - 1
        if left:
            state.site_cells[site] = left
        else:
            del state.site_cells[site]
            state.site_seen.pop(site, None)


def _latest(cells: SiteCells, i: int) -> str:
    """The latest word on a cell that steers, however old: ``standing`` without the
    block's expiry (what ``latest_counts`` counts, for /metrics)."""
    blocked_at, through_at = cells.blocked_at[i], cells.through_at[i]
    if blocked_at and blocked_at >= through_at:
        return BLOCKED
    return THROUGH if through_at else NONE


def _move(cells: SiteCells, before: str, after: str) -> None:
    if before == after:
        return
    if before == THROUGH:
        cells.latest_through -= 1
    elif before == BLOCKED:
        cells.latest_blocked -= 1
    if after == THROUGH:
        cells.latest_through += 1
    elif after == BLOCKED:
        cells.latest_blocked += 1


def standing_at(through_at: int, blocked_at: int, now: int) -> str:
    """Whether a proxy gets through to a site at log time ``now``, when the latest
    answers through and turned away were at ``through_at`` and ``blocked_at`` (0: never)."""
    if blocked_at and now - blocked_at < BLOCK_KEEP_MS and blocked_at >= through_at:
        return BLOCKED
    return THROUGH if through_at else NONE


class Cell(NamedTuple):
    """One cell, read out of its row."""

    through_at: int
    blocked_at: int
    through: int
    blocked: int
    vantages: tuple[str, ...]


def _found(state: State, proxy: ProxyKey, site: str) -> tuple[SiteCells, int] | None:
    """The row of the cell of ``proxy`` and ``site`` and its index there, if any."""
    number = state.site_proxies.get(proxy)
    cells = None if number is None else state.sites.get((site, number.no // CHUNK))
    if number is None or cells is None:
        return None
    i, there = _index(cells, number.no)
    return (cells, i) if there else None


def _index(cells: SiteCells, no: int) -> tuple[int, bool]:
    """Where the cell of proxy number ``no`` is in its row, or would go; whether it is
    there."""
    place = no % CHUNK
    i = bisect_left(cells.nos, place)
    return i, i < len(cells.nos) and cells.nos[i] == place


def cell(state: State, proxy: ProxyKey, site: str) -> Cell | None:
    """The cell of ``proxy`` and ``site``; None when there is none."""
    found = _found(state, proxy, site)
    if found is None:
        return None
    cells, i = found
    codes = cells.vantages[i * MAX_VANTAGES : (i + 1) * MAX_VANTAGES]
    return Cell(
        cells.through_at[i],
        cells.blocked_at[i],
        cells.through[i],
        cells.blocked[i],
        tuple(cells.agents[c - 1] for c in codes if c),
    )


def standing(state: State, proxy: ProxyKey, site: str, now: int) -> str:
    """Whether ``proxy`` gets through to ``site`` at log time ``now``."""
    found = _found(state, proxy, site)
    if found is None:
        return NONE
    cells, i = found
    return standing_at(cells.through_at[i], cells.blocked_at[i], now)


def heard_at(state: State, proxy: ProxyKey, site: str) -> int:
    """The log time of the latest word that steers on ``proxy`` and ``site`` (0: none)."""
    found = _found(state, proxy, site)
    if found is None:
        return 0
    cells, i = found
    return int(max(cells.through_at[i], cells.blocked_at[i]))


def through_until(
    cells: SiteCells, now: int, proxy_of: dict[int, ProxyKey]
) -> tuple[list[ProxyKey], int]:
    """The proxies of a row of cells that get through to its site at ``now`` (0: as of
    the latest words, no block expired), ``standing_at`` a column at a time; and the
    log time until which that answer stands while the row does not change: the earliest
    lifting of a block in force (``MAX_UNTIL`` when none is, or ``now`` is 0)."""
    kept_from = now - BLOCK_KEEP_MS  # a block at or before it has been lifted
    base = cells.chunk * CHUNK
    found, until = [], MAX_UNTIL
    for place, through_at, blocked_at in zip(
        cells.nos, cells.through_at, cells.blocked_at, strict=True
    ):
        if not through_at:
            continue
        if blocked_at >= through_at and blocked_at > kept_from:
            until = min(until, blocked_at + BLOCK_KEEP_MS)
        else:
            found.append(proxy_of[base + place])
    return found, until if now else MAX_UNTIL


MAX_UNTIL = 1 << 62


def moved(
    cells: SiteCells, since: int, now: int, proxy_of: dict[int, ProxyKey]
) -> list[tuple[str, int, str, str]]:
    """The cells of a row with a word that steers after log time ``since``, as (ip,
    port, site, standing at ``now``), those whose standing is not unknown."""
    out, base = [], cells.chunk * CHUNK
    for place, through_at, blocked_at in zip(
        cells.nos, cells.through_at, cells.blocked_at, strict=True
    ):
        if max(through_at, blocked_at) > since:
            said = standing_at(through_at, blocked_at, now)
            if said != NONE:
                ip, port = proxy_of[base + place]
                out.append((ip, port, cells.site, said))
    return out


def tally(cells: SiteCells, now: int) -> tuple[int, int]:
    """How many cells of a row get through to its site at ``now``, and how many are
    turned away (the rest are unknown)."""
    through = blocked = 0
    for through_at, blocked_at in zip(cells.through_at, cells.blocked_at, strict=True):
        said = standing_at(through_at, blocked_at, now)
        if said == THROUGH:
            through += 1
        elif said == BLOCKED:
            blocked += 1
    return through, blocked


def keys(state: State) -> Iterator[SiteKey]:
    """Every cell's (ip, port, site)."""
    for cells in state.sites.values():
        for place in cells.nos:
            ip, port = state.site_proxy[cells.chunk * CHUNK + place]
            yield ip, port, cells.site


def latest_counts(state: State) -> dict[str, dict[str, int]]:
    """Per site with any, its cells whose latest word that steers is through, and turned
    away, however old (/metrics)."""
    counts: dict[str, dict[str, int]] = {}
    for cells in state.sites.values():
        if cells.latest_through or cells.latest_blocked:
            site = counts.setdefault(cells.site, {THROUGH: 0, BLOCKED: 0})
            site[THROUGH] += cells.latest_through
            site[BLOCKED] += cells.latest_blocked
    return counts


def reindex(state: State) -> None:
    """The derived counts and index of the cells, after a restore."""
    state.site_cells, state.site_seen = {}, {}
    for cells in state.sites.values():
        state.site_cells[cells.site] = state.site_cells.get(cells.site, 0) + len(cells.nos)
        state.site_seen[cells.site] = max(state.site_seen.get(cells.site, 0), cells.last_at)
    state.site_proxy = {p.no: (p.ip, p.port) for p in state.site_proxies.values()}
