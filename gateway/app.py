"""The aiohttp gateway: the app factory and the endpoints about the gateway itself.

Shared objects live behind ``web.AppKey``s; the fold runs on the same event loop and
never awaits inside a batch, so no handler sees a half-applied event.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiohttp import web

from eventlog.protocol import EventLog
from events.mint import now_ms
from gateway.api import openapi
from gateway.bounds import (
    CONSUMER_LOG_BURST,
    CONSUMER_LOG_BYTES_PER_HOUR,
    REFUSALS,
    REPORTS_BURST,
    REPORTS_PER_HOUR,
    UNTESTED_LOG_BURST,
    UNTESTED_LOG_BYTES_PER_HOUR,
)
from gateway.checkout import routes as checkout_routes
from gateway.commands import ANONYMOUS_REPORTS, CONSUMER_LOG, GRANTER, REPORTS, UNTESTED_LOG
from gateway.commands import routes as command_routes
from gateway.deleted import Deleted
from gateway.deposits import PAGES, Inputs, Pages, sweeping
from gateway.deposits import routes as deposit_routes
from gateway.dropin import DELETED
from gateway.dropin import routes as dropin_routes
from gateway.endpoints import ENDPOINTS, EndpointBoard
from gateway.endpoints import routes as endpoint_routes
from gateway.http import (
    AUTH_FAILURES,
    CONFIG,
    FOLD,
    LIMITER,
    LOG,
    TRUSTED,
    GatewayConfig,
    RateLimiter,
    middleware,
    open_query,
    reply,
)
from gateway.judge import JUDGE_DOOR, JudgeDoor, JudgeKeys, enrolled_in, judge, judge_bytes
from gateway.leases import Granter
from gateway.metrics import ENDPOINT_OUTCOMES
from gateway.metrics import routes as metrics_routes
from gateway.natsauth import Callout, Kicker
from gateway.panels import PANELS, Panels
from gateway.penalty import PENALTIES, Penalties, watching
from gateway.queries import routes as query_routes
from gateway.views import POOL_VIEW, PoolViewKeeper, following, pool_census
from projections.core.quality import HOSTING_LIST
from projections.live import FoldService
from projections.tasks import stop_tasks
from reducers.pool import lease_live

__all__ = ["FOLD", "make_app"]

log = structlog.get_logger("ppf.gateway")
routes = web.RouteTableDef()
_OPENAPI = msgspec.json.encode(openapi())


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    fold = request.app[FOLD]
    ok = fold.running
    return reply({"ok": ok, "applied_seq": fold.applied_seq}, 200 if ok else 503)


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    fold = request.app[FOLD]
    head = await fold.head_seq()
    ready = fold.running and head - fold.applied_seq <= request.app[CONFIG].lag_bound
    body = {"ready": ready, "applied_seq": fold.applied_seq, "head_seq": head}
    return reply(body, 200 if ready else 503)


def _activity(state: Any, now: int, limit: int = 50) -> list[dict[str, Any]]:
    """The most recently seen agents: role, last seen, events by type, leases held now."""
    recent = sorted(state.agents.values(), key=lambda a: (-a.last_seen, a.name))[:limit]
    return [
        {
            "name": a.name,
            "role": a.role,
            "last_seen": a.last_seen,
            "events": dict(a.counts),
            "active_leases": sum(
                1 for t in state.holders.get(a.name, ()) if lease_live(state.leases[t], now)
            ),
            "lost": a.lost,
            "late": a.late,
            "rejected": a.rejected,
        }
        for a in recent
    ]


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    open_query(request)
    fold = request.app[FOLD]
    state = fold.state
    head = await fold.head_seq()
    granter = request.app[GRANTER]
    now = now_ms()
    pool = await pool_census(request.app, state, now, idle=head <= fold.applied_seq)
    digest_seq, digest = fold.digest()
    active = sum(1 for a in state.agents.values() if now - a.last_seen <= 300_000)
    tap = fold.tap.stats if fold.tap is not None else None
    store = request.app[CONFIG].deposits
    guard = request.app[CONFIG].disk_guard
    return reply(
        {
            "applied_seq": fold.applied_seq,
            "head_seq": head,
            "lag": max(head - fold.applied_seq, 0),
            "lag_s": fold.lag_s(head),
            "digest": digest,
            "digest_seq": digest_seq,
            # Its parts (`projections.digests`): which table a differing replay differs in.
            "digests": fold.checkpointer.digest_parts,
            "rates": fold.stats.rates(),
            "proxies": {"known": pool["known"], "alive": pool["alive"]},
            "pool": pool,
            "queues": {
                "due_sources": granter.ranking.count(now),
                "stale_proxies": pool["stale"],
                "dlq_pending": fold.dead_letters.pending,
            },
            "sources": len(state.sources),
            "leases": len(state.leases),
            "agents": len(state.agents),
            "agents_active_5m": active,
            # Agents whose own network is down: their silence is not the sources' fault.
            "outages": [
                {"agent": a.name, "outage": a.outage, "since": a.outage_since}
                for a in state.agents.values()
                if a.outage
            ],
            "agent_activity": _activity(state, now),
            "rejected": fold.folder.rejected,
            "resent": fold.folder.resent,  # agents' re-sends met and ignored
            "resent_by_agent": dict(state.resent),
            # Addresses the service has still to locate (projections/locator.py).
            # ... and the list that says which networks are datacenters
            # (projections/core/quality.py), read with the pool, not kept in the log.
            "geo": {"unlocated": len(state.unlocated), "hosting_list": HOSTING_LIST},
            "dlq_sent": fold.dead_letters.sent,
            "grants": {
                "granted": granter.granted,
                "lost": granter.lost,
                # Lease subjects looked up ahead of the grants, and candidates passed over
                # because the log had moved past the projection (gateway/lookahead.py).
                "looked_up": granter.lookahead.lookups,
                "passed_over": granter.lookahead.passed_over,
            },
            "nats_ops": dict(request.app[LOG].ops),
            # The deposit store's operations by outcome (put.ok, get.missing, ...).
            "deposit_ops": dict(store.ops) if store is not None else {},
            "seed": granter.seeds.status(now),
            "tap": None
            if tap is None
            else {
                "fed": tap.fed,
                "sent": tap.sent,
                "dropped": tap.dropped + tap.failed,
                "errors": tap.errors,
                "last_error": tap.last_error,
            },
            "warnings": [w for w in (guard.warning if guard else "",) if w],
            "log": _log_span(fold, now),
            "settings": state.settings,
            # The rotating endpoints' traffic, as they report it (gateway/endpoints.py),
            # and the pool's sites and quality, no site named (gateway/panels.py).
            "endpoint": request.app[ENDPOINTS].summary(time.monotonic()),
            **request.app[PANELS].get(request.app),
        }
    )


def _log_span(fold: FoldService, now: int) -> dict[str, Any] | None:
    """What the stream holds and the snapshots kept, as last read (every 5 s); None where
    the fold has no snapshot store."""
    snaps = fold.snapshots
    if snaps is None or snaps.span is None:
        return None
    span = snaps.span
    return {
        "first_seq": span.first_seq,
        "bytes": span.bytes,
        "age_s": round((now - span.first_ts) / 1000) if span.first_ts else 0,
        "snapshots": snaps.kept,
        "oldest_snapshot": snaps.kept[0] if snaps.kept else None,
        "trims": snaps.policy.trim if snaps.policy is not None else False,
    }


class Series:
    """The dashboard's time series: a point every ``every_s``, the last hour or so."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.points: deque[dict[str, Any]] = deque(maxlen=360)

    async def run(self, app: web.Application) -> None:
        while True:
            try:
                self.sample(app, await app[FOLD].head_seq())
            except Exception as exc:  # NATS away: a gap in the chart, not a dead sampler
                log.warning("series_sample_failed", error=repr(exc))
            await asyncio.sleep(self.every_s)

    def sample(self, app: web.Application, head: int) -> None:
        fold = app[FOLD]
        # The pool view the queries built, if any: a sample builds none of its own.
        view = app[POOL_VIEW].current
        by_proto = view.census(now_ms())["by_proto"] if view is not None else {}
        rates = fold.stats.rates()["1m"]
        self.points.append(
            {
                "t": now_ms(),
                "alive_by_proto": by_proto,
                "fold_rate": rates["fold"],
                "fetch_rate": rates["Fetched"],
                "error_rate": rates["Fetched.failed"],
                "lag": max(head - fold.applied_seq, 0),
            }
        )


SERIES = web.AppKey("series", Series)


@routes.get("/v1/outages")
async def outages(request: web.Request) -> web.Response:
    """Networks where many proxies failed at once while the checkers' own way out held:
    real deaths, applied, shown as that network's outage (projections/core/recheck.py). A
    pool scan, so computed at most every 30 s, and kept out of /v1/stats, which must
    cost nothing."""
    open_query(request)
    return reply({"networks": request.app[GRANTER].rechecks.network_outages(now_ms())})


@routes.get("/v1/stats/series")
async def series(request: web.Request) -> web.Response:
    open_query(request)
    return reply(
        {"every_s": request.app[SERIES].every_s, "points": list(request.app[SERIES].points)}
    )


async def _guarding(app: web.Application) -> AsyncIterator[None]:
    guard = app[CONFIG].disk_guard
    assert guard is not None
    await guard.start()
    yield
    await guard.stop()


async def _sampling(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[SERIES].run(app), name="ppf-series")
    yield
    await stop_tasks([task], 5)


async def _granting_ahead(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[GRANTER].prepare(), name="ppf-grants-ahead")
    yield
    await stop_tasks([task], 5)


async def _nats_auth(app: web.Application) -> AsyncIterator[None]:
    """Answer the server's questions about agents' NATS logins, and cut the connections
    of agents whose token changes (gateway/natsauth.py)."""
    auth = app[CONFIG].agent_nats
    assert auth is not None
    fold = app[FOLD]
    penalized = app[PENALTIES].penalized
    callout = Callout(auth, lambda: fold.state, penalized)
    kicker = Kicker(auth, lambda: fold.state, cut_off=penalized)
    await callout.start()
    await kicker.start()
    task = asyncio.create_task(kicker.run(), name="ppf-kicker")
    yield
    await stop_tasks([task], 5)
    await kicker.close()
    await callout.stop()


routes.get("/judge")(judge)
routes.get("/judge/bytes")(judge_bytes)


_DASHBOARD = (Path(__file__).parent / "static" / "index.html").read_bytes()


@routes.get("/")
async def dashboard(request: web.Request) -> web.Response:
    """One page, no build step: it polls the JSON endpoints."""
    return web.Response(body=_DASHBOARD, content_type="text/html")


@routes.get("/openapi.json")
async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(body=_OPENAPI, content_type="application/json")


def make_app(
    fold: FoldService, lg: EventLog | None = None, config: GatewayConfig | None = None
) -> web.Application:
    config = config or GatewayConfig()
    app = web.Application(middlewares=[middleware], client_max_size=config.max_body)
    app[FOLD] = fold
    app[LOG] = lg or fold.log
    app[CONFIG] = config
    app[LIMITER] = RateLimiter(config.rate_per_s, config.burst)
    app[AUTH_FAILURES] = RateLimiter(config.auth_failures_per_s, config.auth_failures_burst)
    app[ANONYMOUS_REPORTS] = RateLimiter(
        config.anonymous_reports_per_hour / 3600, config.anonymous_reports_burst
    )
    app[UNTESTED_LOG] = RateLimiter(UNTESTED_LOG_BYTES_PER_HOUR / 3600, UNTESTED_LOG_BURST)
    app[CONSUMER_LOG] = RateLimiter(CONSUMER_LOG_BYTES_PER_HOUR / 3600, CONSUMER_LOG_BURST)
    app[REPORTS] = RateLimiter(REPORTS_PER_HOUR / 3600, REPORTS_BURST)
    app[DELETED] = Deleted()
    app[TRUSTED] = tuple(ipaddress.ip_network(n, strict=False) for n in config.trusted_proxies)
    app[POOL_VIEW] = PoolViewKeeper(foreground=fold.foreground, catching_up=fold.catching_up)
    fold.cut_waits_for = app[POOL_VIEW].wanted  # the view users wait on goes first
    app[GRANTER] = Granter(
        fold,
        app[LOG],
        max_per_agent=config.max_leases_per_agent,
        recheck=config.recheck,
        probing=config.probing,
        inputs=Inputs(config.deposits),
        guard=config.disk_guard,
    )
    app[SERIES] = Series(config.series_every_s)
    # A gateway without the fleet's judge secret makes one of its own: its /judge then
    # answers the agents it hands keys to (GET /v1/agents/me), not those of others.
    app[JUDGE_DOOR] = config.judge or JudgeDoor(
        JudgeKeys(os.urandom(32)), enrolled_in(lambda: fold.state)
    )
    app[REFUSALS] = app[JUDGE_DOOR].refusals  # the judge's bytes count with the rest
    app[PAGES] = Pages()
    app[PENALTIES] = Penalties(lambda: fold.dead_letters.refused_bytes)
    app[ENDPOINTS] = EndpointBoard()
    app[PANELS] = Panels()
    app.on_cleanup.append(lambda app: app[PANELS].stop())
    app.cleanup_ctx.append(_sampling)
    app.cleanup_ctx.append(_granting_ahead)
    app.cleanup_ctx.append(sweeping)
    app.cleanup_ctx.append(watching)
    app.cleanup_ctx.append(following)
    if config.disk_guard is not None:
        app.cleanup_ctx.append(_guarding)
    if config.agent_nats is not None and config.agent_nats.enforced:
        app.cleanup_ctx.append(_nats_auth)
    app.add_routes(routes)
    app.add_routes(query_routes)
    app.add_routes(command_routes)
    app.add_routes(deposit_routes)
    app.add_routes(metrics_routes)
    app.add_routes(dropin_routes)
    app.add_routes(checkout_routes)
    app.add_routes(endpoint_routes)
    if config.endpoint_outcomes is not None:
        app[ENDPOINT_OUTCOMES] = config.endpoint_outcomes
    return app
