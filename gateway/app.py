"""The aiohttp gateway: the app factory and the endpoints about the gateway itself.

Shared objects live behind ``web.AppKey``s; the fold runs on the same event loop and
never awaits inside a batch, so no handler sees a half-applied event.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from aiohttp import web

from gateway.api import openapi
from gateway.commands import GRANTER
from gateway.commands import routes as command_routes
from gateway.http import (
    CONFIG,
    FOLD,
    LIMITER,
    LOG,
    GatewayConfig,
    RateLimiter,
    middleware,
    open_query,
    reply,
)
from gateway.leases import Granter
from gateway.queries import SNAPSHOT, SnapshotKeeper
from gateway.queries import routes as query_routes
from ops.fold_service import FoldService
from ops.log import Log, now_ms
from projections.readmodels import ProxyFilter

__all__ = ["FOLD", "make_app"]

routes = web.RouteTableDef()
_OPENAPI = msgspec.json.encode(openapi())
_ALIVE = ProxyFilter()


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


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    open_query(request)
    fold = request.app[FOLD]
    state = fold.state
    head = await fold.head_seq()
    snap = request.app[SNAPSHOT].get(request)
    granter = request.app[GRANTER]
    alive = sum(1 for _ in snap.select(_ALIVE, now_ms(), limit=0))
    return reply(
        {
            "applied_seq": fold.applied_seq,
            "head_seq": head,
            "lag": max(head - fold.applied_seq, 0),
            "digest": fold.digest(),
            "proxies": {"known": len(state.proxies), "alive": alive},
            "sources": len(state.sources),
            "leases": len(state.leases),
            "agents": len(state.agents),
            "rejected": fold.folder.rejected,
            "dlq_sent": fold.dlq_sent,
            "grants": {"granted": granter.granted, "lost": granter.lost},
            "settings": state.settings,
        }
    )


@routes.get("/judge")
async def judge(request: web.Request) -> web.Response:
    """Echo the caller's address and every header: agents classify anonymity from it."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return reply(
        {
            "remote": request.remote,
            "peer": list(peer[:2]) if peer else None,
            "method": request.method,
            "path": request.path_qs,
            "headers": [[str(k), v] for k, v in request.headers.items()],
        }
    )


_DASHBOARD = (Path(__file__).parent / "static" / "index.html").read_bytes()


@routes.get("/")
async def dashboard(request: web.Request) -> web.Response:
    """One page, no build step: it polls the JSON endpoints (issue 5 grows it)."""
    return web.Response(body=_DASHBOARD, content_type="text/html")


@routes.get("/openapi.json")
async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(body=_OPENAPI, content_type="application/json")


def make_app(
    fold: FoldService, lg: Log | None = None, config: GatewayConfig | None = None
) -> web.Application:
    config = config or GatewayConfig()
    app = web.Application(middlewares=[middleware], client_max_size=config.max_body)
    app[FOLD] = fold
    app[LOG] = lg or fold.log
    app[CONFIG] = config
    app[LIMITER] = RateLimiter(config.rate_per_s, config.burst)
    app[SNAPSHOT] = SnapshotKeeper()
    app[GRANTER] = Granter(fold, app[LOG], max_per_agent=config.max_leases_per_agent)
    app.add_routes(routes)
    app.add_routes(query_routes)
    app.add_routes(command_routes)
    return app
