"""Proxy liveness: a proxy lives as long as some agent keeps confirming it.

Liveness itself (alive / stale / dead) is a function of ``now`` and is answered by the
read models; this module only records facts and evicts what the log's own time has
left dead for good.
"""

from __future__ import annotations

from events.address import proxy_address_ok
from events.catalogue import ProxyFailed, ProxyReported, ProxyWorked
from reducers import geo, quality, reports, sites, trust
from reducers.pool import BUCKET_MS, band_edges
from reducers.state import MAX_SAMPLE_MS, AgentRow, ProxyKey, ProxyRow, State

__all__ = [
    "SHARED",
    "SWEEP_MS",
    "failed",
    "purge_refused",
    "reported",
    "reports_left",
    "sweep",
    "worked",
]

# Eviction runs when the log's time enters a new bucket of this size: a point every
# replica and every replay meets at the same message.
SWEEP_MS = 600_000
_VANTAGES = 4  # agents kept in a failing proxy's failed_by


def _add(items: tuple[str, ...], item: str, cap: int) -> tuple[str, ...]:
    if not item or item in items or len(items) >= cap:
        return items
    return (*items, item)


# One str object per common value, not one per row: msgspec decodes a fresh string for
# every field of every event, and a million rows would keep a million copies of "http".
SHARED = {
    s: s
    for s in ("http", "https", "socks4", "socks5", "transparent", "anonymous", "elite", "yes", "no")
}


def worked(state: State, event: ProxyWorked, ts: int, agent: str, source: str) -> bool | None:
    """Record a confirmation: True for a new proxy, False for a known one, None if rejected.

    Addresses are validated when a proxy is admitted; a known key passed that check
    under the settings of its time, and ``purge_refused`` removes what lab mode or an
    older address rule admitted when the settings narrow. ``agent`` and ``source`` are
    the projection's own copies of those names (shared, not copied per row). This is
    the hottest path of the fold.
    """
    key: ProxyKey = (event.ip, event.port)
    row = state.proxies.get(key)
    settings = state.settings
    latency = event.latency_ms if event.latency_ms > 0 else 0
    if row is None:
        if not proxy_address_ok(event.ip, event.port, lab=settings.lab, rule=settings.address_rule):
            return None
        proto = SHARED.get(event.proto, event.proto)
        row = ProxyRow(
            ip=event.ip,
            port=event.port,
            proto=proto,
            protos=(proto,),
            first_seen=ts,
            last_seen=ts,
            latency_ema=float(latency),
        )
        state.proxies[key] = row
        geo.admitted(state, row)
        new = True
        was_bucket, was_proto, was_anonymity = -1, "", ""
    else:
        if settings.trust and agent in state.judges:
            trust.checked(state, row, ts, True)
        # Where the row is counted now (reducers/pool.py): most confirmations stay in
        # their bucket, and then the counts are left alone (the hot path stays cheap).
        was_bucket, was_proto, was_anonymity = row.last_seen // BUCKET_MS, row.proto, row.anonymity
        if row.fail_streak:  # suspect no more: out of the failing counts, as it was counted
            state.failing.remove(row.last_seen, was_proto, was_anonymity, row.country)
        a = settings.ema_alpha
        row.latency_ema = a * latency + (1.0 - a) * row.latency_ema
        if event.proto != row.proto:
            row.proto = SHARED.get(event.proto, event.proto)
            row.protos = _add(row.protos, row.proto, 8)
        if ts > row.last_seen:
            row.last_seen = ts
        new = False
    row.confirmations += 1
    if state.doubted and key in state.doubted and (agent in state.trusted or not settings.trust):
        reports.cleared(state, key)  # a consumer's doubt, answered by a trusted check
    if row.fail_streak:
        row.flaps += 1  # back after failing
        row.fail_streak = 0
        row.failed_by = ()
    keep = 2 * settings.latency_samples
    sample = (latency if latency < MAX_SAMPLE_MS else MAX_SAMPLE_MS).to_bytes(2, "little")
    row.samples = (row.samples + sample)[-keep:] if keep else b""
    exit_ip = event.exit_ip
    if exit_ip and exit_ip != row.exit_ip:
        row.exit_ip = row.ip if exit_ip == row.ip else exit_ip
    if event.anonymity and event.anonymity != row.anonymity:
        row.anonymity = SHARED.get(event.anonymity, event.anonymity)
    row.mitm = event.mitm
    if event.https:
        row.https = SHARED.get(event.https, event.https)
    if new:
        state.composition.add(row)
    elif (
        row.last_seen // BUCKET_MS != was_bucket
        or row.proto != was_proto
        or row.anonymity != was_anonymity
    ):
        state.composition.remove(was_bucket * BUCKET_MS, was_proto, was_anonymity, row.country)
        state.composition.add(row)
    if agent not in row.agents:
        if len(row.agents) < settings.provenance_cap:
            row.agents = (*row.agents, agent)
        elif agent in state.trusted:
            row.agents = trust.make_room(state, row.agents, agent)
    if source not in row.sources:
        row.sources = _add(row.sources, source, settings.provenance_cap)
    state.dirty["proxies"].add(key)
    if settings.quality:
        quality.checked(state, key, True, ts, agent)
        quality.measured(state, key, event.speed_kb_s, ts, agent)
    return new


def purge_refused(state: State) -> int:
    """Lab mode ended, or the address rule narrowed: drop every proxy the settings now
    refuse."""
    lab, rule = state.settings.lab, state.settings.address_rule
    gone = [k for k in state.proxies if not proxy_address_ok(k[0], k[1], lab=lab, rule=rule)]
    _evict(state, gone)
    return len(gone)


def _evict(state: State, keys: list[ProxyKey]) -> None:
    for key in keys:
        row = state.proxies.pop(key)
        if state.doubted:
            reports.cleared(state, key)
        state.composition.remove(row.last_seen, row.proto, row.anonymity, row.country)
        if row.fail_streak:
            state.failing.remove(row.last_seen, row.proto, row.anonymity, row.country)
        geo.evicted(state, row)
        if key in state.site_proxies:
            sites.forget(state, key)
        if state.quality:
            quality.forget(state, key)
        state.dirty["proxies"].add(key)


def failed(state: State, event: ProxyFailed, ts: int, agent: str) -> bool:
    """Record a failed recheck of a known proxy; False when the proxy is unknown. The
    proxy is then suspect until its next success (readmodels.status_at)."""
    key: ProxyKey = (event.ip, event.port)
    row = state.proxies.get(key)
    if row is None:
        return False
    if state.settings.trust:
        if agent in state.judges:
            trust.checked(state, row, ts, False)
        if agent not in state.trusted:
            # A failure makes a proxy suspect (out of the served pool until its next
            # success): the word of an agent nobody vouches for must not empty the pool.
            return True
    if not row.fail_streak:
        state.failing.add(row)
    row.fail_streak += 1
    if ts > row.last_failed:
        row.last_failed = ts
    row.failed_by = _add(row.failed_by, agent, _VANTAGES)
    state.dirty["proxies"].add(key)
    if state.settings.quality:
        quality.checked(state, key, False, ts, agent)
    return True


def reported(state: State, event: ProxyReported, ts: int, consumer: AgentRow) -> bool:
    """A consumer's word on a proxy it was served; True when it changed the proxy.
    Once ``guarded``, reducers/reports.py decides; before it, this:

    ``failed`` makes a proxy it finds alive suspect at once (as a failed check does) and
    puts it ahead of the routine rechecks (``reported_at``), within the consumer's budget
    of ``report_budget_per_hour``: one token cannot empty the pool. ``worked`` changes
    nothing: a report never revives a proxy, only a check does. A proxy that is suspect
    already is left as it is (its fail streak, which spaces rechecks, is the checkers')."""
    if state.settings.guarded:
        return reports.reported(state, event, ts, consumer)
    key: ProxyKey = (event.ip, event.port)
    row = state.proxies.get(key)
    if row is None or event.outcome != "failed" or row.fail_streak > 0:
        return False
    if not reports_left(state, consumer, ts):
        return False
    hour = ts // 3_600_000
    if consumer.report_hour != hour:
        consumer.report_hour, consumer.reports_acted = hour, 0
    consumer.reports_acted += 1
    state.failing.add(row)
    row.fail_streak = 1
    row.reported_at = ts
    state.dirty["proxies"].add(key)
    return True


def reports_left(state: State, consumer: AgentRow | None, ts: int) -> int:
    """Failed reports ``consumer`` may still make act in the hour (of log time) of ``ts``."""
    hour = ts // 3_600_000
    used = consumer.reports_acted if consumer is not None and consumer.report_hour == hour else 0
    return max(0, state.settings.report_budget_per_hour - used)


def sweep(state: State, ts: int) -> int:
    """Evict proxies dead for good (not seen for 3 TTLs) at log time ``ts``."""
    _, horizon = band_edges(ts, state.settings.proxy_ttl_s)
    dead = [key for key, row in state.proxies.items() if row.last_seen < horizon]
    _evict(state, dead)
    return len(dead)
