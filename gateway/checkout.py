"""Exclusive checkout (``POST /v1/checkout``): proxies for one consumer alone.

Each proxy handed out is a lease of kind ``proxy`` on it (``ppf.lease.proxy.<ip>_<port>``),
claimed with the compare-and-set every lease uses, so any number of gateways agree and
the log decides; while it holds, ``/v1/proxies``, the drop-in calls, the rotating
endpoint (fed by ``/v1/proxies``) and other checkouts pass it over. A checkout's id is
its consumer's name and idempotency key hashed: the same key finds the same checkout,
kept in the log's state for 48 h, whatever the stream's duplicate window. Per-consumer
cap: ``max_checked_out`` proxies held at once. Released with per-proxy outcomes, folded
as the consumer's reports.
"""

from __future__ import annotations

import hashlib
import re

from aiohttp import web

from events import Released
from events.mint import fresh_id, now_ms
from events.subjects import proxy_of
from events.wire import CheckoutProxy, CheckoutRelease, CheckoutReply, CheckoutRequest
from gateway.bounds import ANONYMOUS_POOL_SHARE, REFUSALS
from gateway.commands import GRANTER, publish_report
from gateway.http import FOLD, LOG, ApiError, authorize, client_address, decode_body, reply
from gateway.queries import hidden_for, quality_of, works_on_of
from gateway.views import POOL_VIEW
from projections.core.readmodels import ProxyFilter
from reducers.pool import lease_live
from reducers.reports import ANONYMOUS
from reducers.state import State

__all__ = ["MAX_CHECKED_OUT", "checkout_id", "routes", "take"]

routes = web.RouteTableDef()
MAX_CHECKED_OUT = 100  # proxies one consumer may hold at once
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def checkout_id(consumer: str, key: str) -> str:
    return hashlib.sha256(f"{consumer}\0{key}".encode()).hexdigest()[:16]


def _answer(state: State, cid: str, now: int) -> CheckoutReply:
    """A checkout as the log holds it: each proxy, its lease, and whether it holds now."""
    entry = state.checkouts[cid]
    out = []
    for lease, target in zip(entry.leases, entry.targets, strict=True):
        ip, port = proxy_of(target)
        row = state.leases.get(target)
        held = row is not None and row.lease == lease and lease_live(row, now)
        proxy = state.proxies.get((ip, port))
        out.append(
            CheckoutProxy(
                ip=ip,
                port=port,
                proto=proxy.proto if proxy is not None else "",
                lease=lease,
                expires_at=row.expires_at if held and row is not None else 0,
                held=held,
            )
        )
    return CheckoutReply(checkout=cid, proxies=out)


async def take(
    request: web.Request,
    name: str,
    body: CheckoutRequest,
    exclude: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset(),
) -> CheckoutReply:
    """Check proxies out for ``name`` (``POST /v1/checkout``, and ``/pop/``), none of
    ``exclude``."""
    if not 1 <= body.count <= 100:
        raise ApiError(400, "bad-parameter", "count: 1 to 100", parameter="count")
    if not 10 <= body.ttl_s <= 3_600:
        raise ApiError(400, "bad-parameter", "ttl_s: 10 to 3600", parameter="ttl_s")
    if body.idempotency_key and not _KEY.fullmatch(body.idempotency_key):
        raise ApiError(400, "bad-parameter", "idempotency_key: 1-64 of A-Z a-z 0-9 _ -")
    fold = request.app[FOLD]
    cid = checkout_id(name, body.idempotency_key or fresh_id())
    if body.idempotency_key:
        # Granted through another gateway a moment ago, maybe: look at the head first.
        await fold.caught_up_now(2.0)
        if cid in fold.state.checkouts:
            return _answer(fold.state, cid, now_ms())
    state = fold.state
    now = now_ms()
    held = sum(
        1
        for t in state.holders.get(name, ())
        if state.leases[t].kind == "proxy" and lease_live(state.leases[t], now)
    )
    room = MAX_CHECKED_OUT - held
    if room <= 0:
        raise ApiError(
            429, "checkout-cap", f"{name} holds {held} proxies (at most {MAX_CHECKED_OUT})"
        )
    f = ProxyFilter(
        proto=body.proto or None,
        country=tuple(c.upper() for c in body.country) or None,
        anonymity=body.anonymity or None,
        https=True if body.https else None,
        max_latency_ms=float(body.max_latency_ms) if body.max_latency_ms else None,
        mitm=False,
        works_on=works_on_of(",".join(body.works_on)),
        **quality_of(
            {
                "min_uptime": body.min_uptime or None,
                "stable_for_s": body.stable_for_s or None,
                "min_speed_kb_s": body.min_speed_kb_s or None,
                "datacenter": body.datacenter or None,
            }
        ),
    )
    hidden = hidden_for(request) | exclude
    view = await request.app[POOL_VIEW].get(request)
    if name == ANONYMOUS:  # callers without a token, together: a small share of the pool
        share = max(1, int(ANONYMOUS_POOL_SHARE * view.census(now)["alive"]))
        if held >= share:
            why = f"callers without a token hold {held} proxies, their share of the pool"
            peer = client_address(request)
            request.app[REFUSALS].refused("anonymous_share", ANONYMOUS, why, peer=peer)
            raise ApiError(429, "checkout-cap", why, headers={"Retry-After": "60"})
        room = min(room, share - held)
    views = [v for v in view.select(f, now, limit=0) if (v.ip, v.port) not in hidden]
    grants = await request.app[GRANTER].grant(
        name, "proxy", body.count, body.ttl_s, proxies=views, checkout=cid, room=room
    )
    if grants:
        await fold.wait_for(max(g.epoch for g in grants), 2.0)
    out = [
        CheckoutProxy(
            ip=g.payload["ip"],
            port=g.payload["port"],
            proto=g.payload["proto"],
            lease=g.lease,
            expires_at=g.expires_at,
            held=True,
        )
        for g in grants
    ]
    return CheckoutReply(checkout=cid, proxies=out)


@routes.post("/v1/checkout")
async def checkout(request: web.Request) -> web.Response:
    caller = authorize(request, "consumer")
    body = await decode_body(request, CheckoutRequest)
    return reply(await take(request, caller.name, body))


@routes.post("/v1/checkout/{checkout}/release")
async def release(request: web.Request) -> web.Response:
    caller = authorize(request, "consumer")
    body = await decode_body(request, CheckoutRelease)
    fold = request.app[FOLD]
    state = fold.state
    cid = request.match_info["checkout"]
    if cid not in state.checkouts:  # granted through another gateway a moment ago?
        await fold.caught_up_now(2.0)
    entry = state.checkouts.get(cid)
    if entry is None or entry.consumer != caller.name:
        raise ApiError(404, "not-found", f"no checkout {cid} of {caller.name}")
    now = now_ms()
    releases = []
    for lease, target in zip(entry.leases, entry.targets, strict=True):
        row = state.leases.get(target)
        if row is not None and row.lease == lease and lease_live(row, now):
            releases.append(
                Released(
                    id=fresh_id(),
                    agent=caller.name,
                    at=now,
                    lease=lease,
                    target=target,
                    outcome="done",
                    counted=False,
                    kind="proxy",
                )
            )
    if releases:
        await request.app[LOG].publish_many(releases)
    reported = 0
    for addr, outcome in body.outcomes.items():
        ip, _, port = addr.rpartition(":")
        if not port.isdigit():
            raise ApiError(400, "bad-parameter", f"outcomes: ip:port keys, not {addr!r}")
        try:
            await publish_report(
                request, caller.name, ip.strip("[]"), int(port), outcome, "checkout"
            )
            reported += 1
        except ApiError as exc:
            if exc.status not in (404, 429):  # gone from the pool, or over budget: skipped
                raise
    return reply({"checkout": cid, "released": len(releases), "reported": reported})
