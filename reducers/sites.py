"""Per-site standing: which proxies get through to which site, from the fleet's verdicts.

A cell per proxy and site with evidence (``SiteRow``): when an answer last got through
and when one was last turned away, how many of each, and from which vantages (at most
``MAX_VANTAGES`` agents). Only an agent trusted at the time moves the times
(reducers/trust.py: an untested agent's verdicts are counted and steer no one); with
trust off, every agent. A cell lives as long as its proxy. A site holds at most
``MAX_CELLS`` cells and the table at most ``MAX_SITES`` sites: past them a verdict is
counted as not kept (``State.sites_unkept``), first come first kept, so every replica
keeps the same cells. A block is never the proxy's failure: nothing here touches its row.

Reading (``standing``): through while the latest answer through is newer than the latest
block, or the block is older than ``BLOCK_KEEP_MS``; turned away while a block is newer
and recent; else unknown. Pure, deterministic: log time only.
"""

from __future__ import annotations

from events.catalogue import ProxyReported, SitesChecked
from events.sites import BLOCKED, NONE, THROUGH
from reducers.rows import ProxyKey, SiteKey, SiteRow, Take
from reducers.state import State

__all__ = [
    "BLOCK_KEEP_MS",
    "MAX_CELLS",
    "MAX_SITES",
    "MAX_VANTAGES",
    "checked",
    "forget",
    "latest",
    "reindex",
    "reported",
    "standing",
    "standing_at",
]

MAX_SITES = 256
MAX_CELLS = 10_000  # per site: 200 sites' worth stay within the gateway's budget
MAX_VANTAGES = 4
BLOCK_KEEP_MS = 6 * 3_600_000  # a site's block of an exit is lifted in hours, not days
_TAKES = 4_096  # consumers' hourly takes per site kept before past hours' are let go


def checked(state: State, batch: SitesChecked, ts: int) -> None:
    """Fold one round of verdicts; results on proxies the pool does not know, and new
    cells past the caps, are counted and not kept."""
    steers = not state.settings.trust or batch.agent in state.trusted
    agent = state.agents.get(batch.agent)
    traffic = agent is not None and agent.role == "endpoint"
    hour = ts // 3_600_000
    for r in batch.results:
        if traffic and steers:
            _traffic_went_to(state, r.site, ts)
        _answered(state, r.site, hour, r.through + r.blocked, traffic)
        key = (r.ip, r.port, r.site)
        cell = _cell(state, key)
        if cell is None:
            continue
        cell.through += r.through
        cell.blocked += r.blocked
        before = latest(cell)
        if steers and (r.through or r.blocked):
            # Both in one round: the more frequent answer is the latest word.
            if r.through > r.blocked:
                cell.through_at = ts
            else:
                cell.blocked_at = ts
        _move(state, r.site, before, latest(cell))
        if batch.agent not in cell.vantages and len(cell.vantages) < MAX_VANTAGES:
            cell.vantages = (*cell.vantages, batch.agent)
        state.dirty_sites.add(key)


def reported(state: State, event: ProxyReported, ts: int) -> None:
    """A consumer's word that ``event.site`` turned a proxy away. It counts; it steers
    for everyone when the consumer is trusted (or trust is off), else only within
    ``report_share`` of the site's cells an hour (at least one), so one token cannot
    turn a site's pool away. A consumer's word that a proxy works never steers."""
    key = (event.ip, event.port, event.site)
    cell = _cell(state, key)
    if cell is None:
        return
    cell.blocked += 1
    if not state.settings.trust or event.agent in state.trusted or _take(state, event, ts):
        before = latest(cell)
        cell.blocked_at = ts
        _move(state, event.site, before, latest(cell))
    state.dirty_sites.add(key)
    state.settings_dirty = True  # meta holds the takes


def _cell(state: State, key: SiteKey) -> SiteRow | None:
    """The cell of ``key``, made when its proxy is known and the caps leave room; None
    (counted as not kept) else."""
    cell = state.sites.get(key)
    if cell is None:
        ip, port, site = key
        if (ip, port) not in state.proxies or not _room(state, site):
            state.sites_unkept += 1
            return None
        cell = state.sites[key] = SiteRow(ip=ip, port=port, site=site)
        state.site_cells[site] = state.site_cells.get(site, 0) + 1
        state.cells_of[(ip, port)] = (*state.cells_of.get((ip, port), ()), site)
    return cell


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


def _room(state: State, site: str) -> bool:
    cells = state.site_cells.get(site)
    if cells is None:
        return len(state.site_cells) < MAX_SITES
    return cells < MAX_CELLS


def forget(state: State, proxy: ProxyKey) -> None:
    """The proxy left the pool: its cells go with it."""
    for site in state.cells_of.pop(proxy, ()):
        key = (proxy[0], proxy[1], site)
        _move(state, site, latest(state.sites.pop(key)), NONE)
        left = state.site_cells[site] - 1
        if left:
            state.site_cells[site] = left
        else:
            del state.site_cells[site]
        state.dirty_sites.add(key)


def latest(cell: SiteRow) -> str:
    """The latest word on the cell that steers, however old: ``standing`` without the
    block's expiry (what ``State.site_latest`` counts, for /metrics)."""
    if cell.blocked_at and cell.blocked_at >= cell.through_at:
        return BLOCKED
    return THROUGH if cell.through_at else NONE


def _move(state: State, site: str, before: str, after: str) -> None:
    if before == after:
        return
    counts = state.site_latest.setdefault(site, {THROUGH: 0, BLOCKED: 0})
    if before != NONE:
        counts[before] -= 1
    if after != NONE:
        counts[after] += 1
    if not any(counts.values()):
        del state.site_latest[site]


def standing(cell: SiteRow, now: int) -> str:
    """Whether the proxy gets through to the cell's site at log time ``now``."""
    return standing_at(cell.through_at, cell.blocked_at, now)


def standing_at(through_at: int, blocked_at: int, now: int) -> str:
    """``standing`` of a cell whose latest answers through and turned away were at
    ``through_at`` and ``blocked_at`` (0: never)."""
    if blocked_at and now - blocked_at < BLOCK_KEEP_MS and blocked_at >= through_at:
        return BLOCKED
    return THROUGH if through_at else NONE


def reindex(state: State) -> None:
    """The derived counts and index of the cells, after a restore."""
    state.site_cells = {}
    state.cells_of = {}
    state.site_latest = {}
    for (ip, port, site), cell in state.sites.items():
        state.site_cells[site] = state.site_cells.get(site, 0) + 1
        state.cells_of[(ip, port)] = (*state.cells_of.get((ip, port), ()), site)
        _move(state, site, NONE, latest(cell))
