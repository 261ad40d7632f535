"""One proxy as ``GET /v1/proxies`` serves it, from the pool view or the projection's row."""

from __future__ import annotations

from typing import Any

from events.wire import ProxyOut
from projections.core.poolview import ProxyView
from projections.core.quality import stable_since, uptime
from projections.core.readmodels import nearest_rank, status_at
from reducers import ProxyRow
from reducers.state import unpack_samples

__all__ = ["ProxyOut", "proxy_out"]  # ProxyOut: events/wire.py, read by the endpoint too


def proxy_out(v: ProxyView | ProxyRow, now: int, ttl: int, confirmed: bool = True) -> ProxyOut:
    p50 = p95 = None
    if v.samples:  # sorted once for both (this runs for every row served)
        ordered = sorted(unpack_samples(v.samples))
        p50, p95 = nearest_rank(ordered, 0.5), nearest_rank(ordered, 0.95)
    if isinstance(v, ProxyRow):
        latency, agents = v.latency_ema, len(v.agents)
    else:
        latency, agents, confirmed = v.latency, v.agents, v.confirmed
    return ProxyOut(
        v.ip,
        v.port,
        v.proto,
        v.protos,
        status_at(v.last_seen, now, ttl, confirmed, v.fail_streak > 0),
        v.last_seen,
        v.first_seen,
        round(latency, 1),
        p50,
        p95,
        v.exit_ip,
        v.anonymity,
        v.mitm,
        v.https,
        v.confirmations,
        agents,
        v.sources,
        v.fail_streak,
        v.country,
        v.asn,
        v.as_org,
        *_signals(v, now),
    )


def _signals(v: ProxyView | ProxyRow, now: int) -> tuple[Any, ...]:
    """A view's quality signals as ``ProxyOut`` says them (a row's: its own route's)."""
    if isinstance(v, ProxyRow):
        return (None,) * 5
    known, q = v.datacenter, v.quality
    share = uptime(q, now)
    return (
        None if not known else known == "yes",
        None if share is None else round(100 * share, 1),
        q.checks if q is not None else None,
        stable_since(q) or None,
        (q.speed_kb_s or None) if q is not None else None,
    )
