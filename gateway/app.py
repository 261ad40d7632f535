"""The aiohttp gateway: thin handlers over the in-memory projections.

Query handlers read the fold's state between two batches (the fold runs on the same
event loop and never awaits inside a batch), so a query never sees a half-applied event.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from ops.fold_service import FoldService
from projections.readmodels import (
    ProxyFilter,
    due_sources,
    percentile,
    proxy_status,
    query_proxies,
    source_score,
)
from reducers import ProxyRow
from reducers.state import latency_samples

__all__ = ["FOLD", "LAG_BOUND", "make_app"]

FOLD = web.AppKey("fold", FoldService)
LAG_BOUND = 1_000  # messages behind the head before /readyz says no

routes = web.RouteTableDef()
_json = msgspec.json.Encoder()


def _now() -> int:
    return time.time_ns() // 1_000_000


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def problem(status: int, kind: str, detail: str, **extra: Any) -> web.Response:
    body = {
        "type": f"https://ppf.dev/problems/{kind}",
        "title": kind.replace("-", " "),
        "status": status,
        "detail": detail,
        **extra,
    }
    return web.Response(
        body=_json.encode(body), status=status, content_type="application/problem+json"
    )


class BadParam(Exception):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name


@web.middleware
async def _problems(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except BadParam as exc:
        return problem(400, "bad-parameter", str(exc), parameter=exc.name)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problem(exc.status, exc.reason.lower().replace(" ", "-"), exc.text or exc.reason)


def _int(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(name, f"not an integer: {raw!r}") from None
    if value < 0:
        raise BadParam(name, "must be >= 0")
    return value


def _choice(request: web.Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in allowed:
        raise BadParam(name, f"one of {', '.join(allowed)}")
    return value


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return _reply({"ok": True})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    fold = request.app[FOLD]
    head = await fold.head_seq()
    ready = head - fold.applied_seq <= LAG_BOUND
    body = {"ready": ready, "applied_seq": fold.applied_seq, "head_seq": head}
    return _reply(body, 200 if ready else 503)


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    fold = request.app[FOLD]
    state = fold.state
    head = await fold.head_seq()
    now = _now()
    ttl = state.settings.proxy_ttl_s
    alive = sum(1 for p in state.proxies.values() if proxy_status(p, now, ttl) == "alive")
    return _reply(
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
            "settings": state.settings,
        }
    )


def _proxy_json(row: ProxyRow, now: int, ttl: int) -> dict[str, Any]:
    samples = latency_samples(row)
    return {
        "ip": row.ip,
        "port": row.port,
        "proto": row.proto,
        "protos": row.protos,
        "status": proxy_status(row, now, ttl),
        "last_seen": row.last_seen,
        "first_seen": row.first_seen,
        "latency_ms": round(row.latency_ema, 1),
        "latency_p50_ms": percentile(samples, 0.5),
        "latency_p95_ms": percentile(samples, 0.95),
        "exit_ip": row.exit_ip,
        "anonymity": row.anonymity,
        "mitm": row.mitm,
        "confirmations": row.confirmations,
        "agents": len(row.agents),
        "sources": row.sources,
        "fail_streak": row.fail_streak,
        "country": row.country,
        "asn": row.asn,
    }


@routes.get("/v1/proxies")
async def proxies(request: web.Request) -> web.StreamResponse:
    state = request.app[FOLD].state
    mitm = request.query.get("mitm")
    if mitm not in (None, "true", "false"):
        raise BadParam("mitm", "true or false")
    latency = _int(request, "max_latency_ms")
    f = ProxyFilter(
        proto=request.query.get("proto") or None,
        country=request.query.get("country") or None,
        asn=_int(request, "asn"),
        anonymity=request.query.get("anonymity") or None,
        max_latency_ms=float(latency) if latency is not None else None,
        status=_choice(request, "status", ("alive", "stale", "dead", "all"), "alive"),
        fresh_s=_int(request, "fresh_s"),
        mitm=None if mitm is None else mitm == "true",
    )
    sort = _choice(request, "sort", ("latency", "last_seen"), "latency")
    fmt = _choice(request, "format", ("json", "txt", "csv"), "json")
    limit = _int(request, "limit", 100) or 0
    now = _now()
    ttl = state.settings.proxy_ttl_s
    rows = query_proxies(state, now, f, sort=sort, limit=limit)
    if fmt == "txt":
        text = "".join(f"{r.proto}://{r.ip}:{r.port}\n" for r in rows)
        return web.Response(text=text, content_type="text/plain")
    if fmt == "csv":
        lines = ["proto,ip,port,latency_ms,anonymity,exit_ip,last_seen"]
        lines += [
            f"{r.proto},{r.ip},{r.port},{r.latency_ema:.1f},{r.anonymity},{r.exit_ip},{r.last_seen}"
            for r in rows
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/csv")
    return _reply({"count": len(rows), "proxies": [_proxy_json(r, now, ttl) for r in rows]})


@routes.get("/v1/sources")
async def sources(request: web.Request) -> web.Response:
    state = request.app[FOLD].state
    now = _now()
    limit = _int(request, "limit", 100) or 0
    due_only = request.query.get("due") == "true"
    if due_only:
        pairs = due_sources(state, now, limit)
    else:
        pairs = sorted(
            ((source_score(r, now), r) for r in state.sources.values()),
            key=lambda p: (-p[0], p[1].url_id),
        )
        pairs = pairs[:limit] if limit else pairs
    items = [
        {**msgspec.structs.asdict(row), "score": round(score, 4), "due": score >= 1.0}
        for score, row in pairs
    ]
    return _reply({"count": len(items), "sources": items})


def make_app(fold: FoldService) -> web.Application:
    app = web.Application(middlewares=[_problems], client_max_size=4 * 1024 * 1024)
    app[FOLD] = fold
    app.add_routes(routes)
    return app
