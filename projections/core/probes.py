"""Which proxies the fleet's checkers probe against which sites: a read model (pure,
``now`` passed in) the gateway hands out with recheck shards (gateway/rechecks.py).

A TARGET probe asks a site's root through a proxy that works and reports the site's
verdict (events/sites.py), never the URL. The sites probed (``targets``): the operator's
(``ppf sites add``, ``State.site_rules``) by every checker; the sites the consumers'
traffic went to in the last ``TRAFFIC_WINDOW_MS`` (``State.site_traffic``) only by the
operator's own checkers (``Settings.trusted_agents``: which sites the traffic goes to is
the consumers' business);
never one on the operator's list of sites never probed, nor one whose name cannot be on
the public internet (a loopback, private or link-local address, an internal name: a
probe through a proxy would reach that proxy's own host) unless the log is a lab's. A
proxy and a site are probed at most once in ``PROBE_GAP_MS`` (four an hour): not while a
verdict from any source is newer than that, nor while a probe of them handed out is.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping

from events.validate import host_can_be_public
from reducers import ProxyRow, State, sites
from reducers.rows import SiteKey

__all__ = ["PROBE_GAP_MS", "TRAFFIC_WINDOW_MS", "targets", "wanted"]

PROBE_GAP_MS = 15 * 60_000
TRAFFIC_WINDOW_MS = 6 * 3_600_000


def targets(state: State, *, own: bool, never: Collection[str], now: int) -> list[str]:
    """The sites a checker probes: the operator's, and for its own checkers (``own``)
    the sites of recent traffic; in name order."""
    names = set(state.site_rules)
    if own:
        since = now - TRAFFIC_WINDOW_MS
        names.update(site for site, at in state.site_traffic.items() if at >= since)
    settings = state.settings
    return sorted(
        site
        for site in names.difference(never)
        if settings.lab
        or host_can_be_public(site, guarded=settings.guarded, rule=settings.address_rule)
    )


def wanted(
    rows: Iterable[ProxyRow],
    names: list[str],
    state: State,
    handed: Mapping[SiteKey, int],
    now: int,
) -> Iterator[tuple[ProxyRow, str]]:
    """(proxy, site) pairs due a probe, lazily: proxies whose latest check worked, by
    ``names`` each, without a verdict nor a probe ``handed`` out in ``PROBE_GAP_MS``."""
    since = now - PROBE_GAP_MS
    for row in rows:
        if row.last_seen <= row.last_failed:
            continue  # failing: a probe through it would say nothing of the site
        for site in names:
            if sites.heard_at(state, (row.ip, row.port), site) >= since:
                continue
            key = (row.ip, row.port, site)
            if handed.get(key, 0) >= since:
                continue
            yield row, site
