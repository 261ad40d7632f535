"""Read endpoints: the pool, sources, leases, agents. Memory only: no DuckDB, no NATS."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import msgspec
import structlog
from aiohttp import web

from events.mint import now_ms
from events.roles import ROLE_EVENTS
from events.sites import site_key_ok
from events.subjects import proxy_of
from events.validate import PROTOS
from events.wire import (
    ME_PATH,
    PROXIES_PATH,
    SITE_CHANGES_PATH,
    SITE_RULES_PATH,
    AgentMe,
    SiteChanges,
    SiteRules,
)
from gateway.bounds import REFUSALS
from gateway.deposits import PAGES
from gateway.formats import FORMATS
from gateway.http import (
    CONFIG,
    FOLD,
    ROLE_ADMIN,
    ApiError,
    Param,
    authorize,
    choice,
    integer,
    open_query,
    reply,
)
from gateway.judge import JUDGE_DOOR
from gateway.penalty import PENALTIES
from gateway.proxyout import proxy_out
from gateway.views import POOL_VIEW
from projections.core.poolview import (
    CENSUS_MS,
    ProxyView,
)
from projections.core.readmodels import (
    ProxyFilter,
    SiteTally,
    due_sources,
    source_score,
)
from reducers import sites, trust
from reducers.pool import STATUSES, lease_live
from reducers.reports import hidden_from
from reducers.rows import SiteCells
from reducers.state import latency_samples

__all__ = ["PROXY_PARAMS", "QUALITY_PARAMS", "WORKS_ON", "quality_of", "routes", "works_on_of"]

routes = web.RouteTableDef()
log = structlog.get_logger("ppf.gateway")
_encode = msgspec.json.Encoder().encode
_json_lines = msgspec.json.Encoder().encode_lines


def _countries(raw: str | None) -> tuple[str, ...] | None:
    """``country=DE,NL``: ISO 3166 alpha-2 codes, any case; 400 names a bad one."""
    if not raw:
        return None
    codes = tuple(c.strip().upper() for c in raw.split(",") if c.strip())
    bad = [c for c in codes if len(c) != 2 or not c.isalpha()]
    if bad or not codes:
        detail = (
            f"country: ISO 3166 alpha-2 codes, comma-separated (not {bad[0] if bad else raw!r})"
        )
        raise ApiError(400, "bad-parameter", detail, parameter="country")
    return codes


# Site keys a proxy must get through to, each of them (reducers/sites.py): on /v1/proxies
# and the drop-in calls alike.
WORKS_ON = Param("works_on")

# The quality signals a proxy must meet (projections/core/quality.py): on /v1/proxies,
# checkout and the drop-in calls alike.
QUALITY_PARAMS = (
    Param("min_uptime", integer=True),  # percent of the known time of the last 7 days
    Param("stable_for_s", integer=True),
    Param("min_speed_kb_s", integer=True),
    Param("datacenter", choices=("true", "false")),
)

# GET /v1/proxies' parameters, declared once: read here, listed in the API document.
PROXY_PARAMS = (
    Param("proto", choices=tuple(sorted(PROTOS))),  # none other is in the pool
    Param("country"),
    Param("asn", integer=True),
    Param("as_org"),
    Param("anonymity", choices=("transparent", "anonymous", "elite")),
    Param("max_latency_ms", integer=True),
    Param("status", choices=(*STATUSES, "all"), default="alive"),
    Param("fresh_s", integer=True),
    # Proxies seen tampering with pages or certificates are left out unless asked for:
    # mitm=true serves only them, mitm=any serves everything.
    Param("mitm", choices=("false", "true", "any"), default="false"),
    Param("https", choices=("true", "false")),
    WORKS_ON,
    *QUALITY_PARAMS,
    Param("limit", integer=True, default=100),
    Param("sort", choices=("latency", "last_seen"), default="latency"),
    Param("format", choices=("json", "ndjson", "txt", *FORMATS), default="json"),
)


_PROXY_PARAM_NAMES = frozenset(p.name for p in PROXY_PARAMS)


def _params(request: web.Request) -> dict[str, Any]:
    """The filters asked for; 400 naming a parameter ``/v1/proxies`` does not take (a
    typo such as ``min_uptme`` would otherwise serve the whole pool unfiltered)."""
    unknown = sorted(set(request.query) - _PROXY_PARAM_NAMES)
    if unknown:
        known = ", ".join(p.name for p in PROXY_PARAMS)
        raise ApiError(
            400,
            "bad-parameter",
            f"{unknown[0]}: not a parameter of this call (it takes {known})",
            parameter=unknown[0],
        )
    return {p.name: p.read(request) for p in PROXY_PARAMS}


def _filter(q: dict[str, Any]) -> ProxyFilter:
    latency = q["max_latency_ms"]
    return ProxyFilter(
        proto=q["proto"],
        country=_countries(q["country"]),
        as_org=q["as_org"],
        asn=q["asn"],
        anonymity=q["anonymity"],
        max_latency_ms=float(latency) if latency is not None else None,
        status=q["status"],
        fresh_s=q["fresh_s"],
        mitm=None if q["mitm"] == "any" else q["mitm"] == "true",
        https=None if q["https"] is None else q["https"] == "true",
        works_on=works_on_of(q["works_on"]),
        **quality_of(q),
    )


def quality_of(q: dict[str, Any]) -> dict[str, Any]:
    """``ProxyFilter``'s quality terms from ``QUALITY_PARAMS``' values; 400 for a
    share outside 0-100 or a negative figure."""
    for name in ("min_uptime", "stable_for_s", "min_speed_kb_s"):
        value = q.get(name)
        if value is not None and (value < 0 or (name == "min_uptime" and value > 100)):
            bound = "0-100" if name == "min_uptime" else "0 or more"
            raise ApiError(400, "bad-parameter", f"{name}: {bound}, not {value}", parameter=name)
    share, dc = q.get("min_uptime"), q.get("datacenter")
    return {
        "min_uptime": None if share is None else share / 100,
        "stable_for_s": q.get("stable_for_s"),
        "min_speed_kb_s": q.get("min_speed_kb_s"),
        "datacenter": None if dc is None else "yes" if dc == "true" else "no",
    }


def works_on_of(raw: str | None) -> tuple[str, ...] | None:
    """``works_on=google.com,reddit.com``: site keys, each of which a proxy must get
    through to; 400 names one that is not a site key."""
    if not raw:
        return None
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    bad = [k for k in keys if not site_key_ok(k)]
    if bad or not keys:
        detail = (
            f"works_on: site keys (lower-case names or addresses), not {bad[0] if bad else raw!r}"
        )
        raise ApiError(400, "bad-parameter", detail, parameter="works_on")
    return keys


def hidden_for(request: web.Request) -> set[tuple[str, int]]:
    """What a read leaves out: proxies checked out now, and, for an authenticated
    read, those its consumer reported failed, until a trusted check
    (reducers/reports.py). A read with a token is authenticated (a bad one: 401);
    without one, open unless queries are private."""
    state = request.app[FOLD].state
    # Checked out (gateway/checkout.py): its consumer's alone until released or expired.
    now = now_ms()  # a checkout past its TTL is over, whether or not the ledger said so yet
    held = {proxy_of(t) for t in state.checked_out if lease_live(state.leases.get(t), now)}
    if "Authorization" not in request.headers:
        open_query(request)
        return held
    caller = authorize(request, "worker", "checker", "seed", "consumer")
    return hidden_from(state, caller.name) | held if held else hidden_from(state, caller.name)


@routes.get(PROXIES_PATH)
async def proxies(request: web.Request) -> web.StreamResponse:
    hidden = hidden_for(request)
    q = _params(request)
    f = _filter(q)
    sort, fmt, limit = q["sort"], q["format"], q["limit"] or 0
    view = await request.app[POOL_VIEW].get(request)
    now = now_ms()
    # The same answer while the view, the TTL's edge (5 s slices) and what is hidden
    # from the caller stay: pollers (the rotating endpoint's feed) get 304 for nothing.
    etag = f'W/"{view.seq}.{now // CENSUS_MS}.{len(hidden)}"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    selected = view.select(f, now, sort=sort, limit=limit + len(hidden) if limit else 0)
    if hidden:
        selected = (v for v in selected if (v.ip, v.port) not in hidden)
    selected = itertools.islice(selected, limit or None)
    if fmt == "ndjson":  # written as it is made: no copy of the whole answer is held
        return await _lines(request, selected, now, view.ttl_s, etag)
    views: list[ProxyView] = []
    while chunk := list(itertools.islice(selected, ANSWER_CHUNK)):
        views.extend(chunk)
        await asyncio.sleep(0)  # a turn of the loop for the requests in flight
    tag = {"ETag": etag}
    if fmt == "txt":
        text = "".join(v.line for v in views)
        return web.Response(text=text, content_type="text/plain", headers=tag)
    if fmt in FORMATS:
        text, content_type = FORMATS[fmt](views)
        return web.Response(text=text, content_type=content_type, headers=tag)
    # The rows in arrays of ANSWER_CHUNK, each encoded between two turns of the loop,
    # joined as the one array they are the pieces of (projections/core/chunks.py does the same
    # with msgpack).
    pieces = []
    for start in range(0, len(views), ANSWER_CHUNK):
        rows = [proxy_out(v, now, view.ttl_s) for v in views[start : start + ANSWER_CHUNK]]
        pieces.append(_encode(rows)[1:-1])
        await asyncio.sleep(0)
    body = b'{"count":%d,"proxies":[%b]}' % (len(views), b",".join(pieces))
    return web.Response(body=body, content_type="application/json", headers=tag)


async def _lines(
    request: web.Request, selected: Iterator[ProxyView], now: int, ttl_s: int, etag: str
) -> web.StreamResponse:
    """``format=ndjson``: a proxy's object a line, streamed ANSWER_CHUNK rows at a time;
    each write waits while the client is behind, and gives the loop back meanwhile."""
    response = web.StreamResponse(headers={"ETag": etag})
    response.content_type = "application/x-ndjson"
    await response.prepare(request)
    try:
        while chunk := list(itertools.islice(selected, ANSWER_CHUNK)):
            await response.write(_json_lines([proxy_out(v, now, ttl_s) for v in chunk]))
            await asyncio.sleep(0)
        await response.write_eof()
    except ConnectionResetError:  # the client went away mid-answer: nothing to say to it
        log.info("answer_abandoned", path=request.path, by="client")
    return response


# Rows of a pool's answer made at a time: the whole pool in one go (the rotating
# endpoint's feed asks for all of it every 5 s) stalls every other request for as
# long as it takes (docs/decisions.md, The gateway).
ANSWER_CHUNK = 100


@routes.get("/v1/proxies/{addr}")
async def one_proxy(request: web.Request) -> web.Response:
    open_query(request)
    ip, _, port = request.match_info["addr"].rpartition(":")
    if not ip or not port.isdigit():
        raise ApiError(400, "bad-parameter", "address: ip:port", parameter="addr")
    state = request.app[FOLD].state
    row = state.proxies.get((ip.strip("[]"), int(port)))
    if row is None:
        raise ApiError(404, "not-found", f"no proxy {ip}:{port} in the pool")
    confirmed = trust.vouched(state)(row.agents)
    body = msgspec.structs.asdict(proxy_out(row, now_ms(), state.settings.proxy_ttl_s, confirmed))
    body["history"] = {
        "confirmations": row.confirmations,
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
        "last_failed": row.last_failed,
        "fail_streak": row.fail_streak,
        "latency_samples_ms": latency_samples(row),
        "confirming_agents": list(row.agents),
    }
    return reply(body)


def _source_json(row: Any, score: float) -> dict[str, Any]:
    return {**msgspec.structs.asdict(row), "score": round(score, 4), "due": score >= 1.0}


@routes.get("/v1/sites")
async def sites_known(request: web.Request) -> web.Response:
    """Per site, what the fleet knows of the pool: the admin's alone (which sites the
    traffic goes to is the consumers' business)."""
    authorize(request, "admin")
    state = request.app[FOLD].state
    tally = SiteTally(now_ms(), state.site_hour)
    async for step in cells_in_steps(state.sites.values()):
        tally.add(step)
    return reply({"sites": tally.answer(), "unkept": state.sites_unkept})


_TALLY_STEP = 10_000  # cells a step: a few milliseconds of the loop


async def cells_in_steps(rows: Iterable[SiteCells]) -> AsyncIterator[list[SiteCells]]:
    """The rows of site cells (as they are now) in steps of about ``_TALLY_STEP``
    cells, the loop given back between steps: a walk of 2 million cells never holds it."""
    step: list[SiteCells] = []
    cells = 0
    for row in list(rows):
        step.append(row)
        cells += len(row.nos)
        if cells >= _TALLY_STEP:
            yield step
            step, cells = [], 0
            await asyncio.sleep(0)
    if step:
        yield step


@routes.get(SITE_CHANGES_PATH)
async def site_changes(request: web.Request) -> web.Response:
    """The cells whose standing moved after log time ``since`` (ms): what an endpoint
    learns of the fleet's verdicts (its feed asks every minute from the ``now`` of its
    last answer), not the whole table; endpoints and the admin only (which sites the
    traffic goes to is the consumers' business)."""
    authorize(request, "endpoint")
    since = integer(request, "since", 0) or 0
    state, now = request.app[FOLD].state, now_ms()
    moved: list[tuple[str, int, str, str]] = []
    recent = (row for row in state.sites.values() if row.last_at > since)
    async for step in cells_in_steps(recent):
        for cells in step:
            moved += sites.moved(cells, since, now, state.site_proxy)
    return reply(SiteChanges(now=now, cells=moved))


@routes.get(SITE_RULES_PATH)
async def site_rules(request: web.Request) -> web.Response:
    """The operator's rules for reading sites' answers (``ppf sites add``): for the
    endpoints that route and the agents that probe, never a consumer or a stranger (the
    sites an operator watches are its business)."""
    authorize(request, "endpoint", "worker", "checker", "seed")
    rules = request.app[FOLD].state.site_rules
    return reply(SiteRules(rules=[rules[site] for site in sorted(rules)]))


@routes.get("/v1/sources")
async def sources(request: web.Request) -> web.Response:
    open_query(request)
    state = request.app[FOLD].state
    now = now_ms()
    limit = integer(request, "limit", 100) or 0
    order = choice(request, "sort", ("score", "yield"), "score")
    if choice(request, "due", ("true", "false"), "false") == "true":
        pairs = due_sources(state, now, 0)
    else:
        pairs = [(source_score(r, now), r) for r in state.sources.values()]
    if order == "yield":
        pairs.sort(key=lambda p: (-p[1].yield_rate, p[1].url_id))
    else:
        pairs.sort(key=lambda p: (-p[0], p[1].url_id))
    pairs = pairs[:limit] if limit else pairs
    items = [_source_json(row, score) for score, row in pairs]
    return reply({"count": len(items), "sources": items})


@routes.get("/v1/sources/{url_id}")
async def one_source(request: web.Request) -> web.Response:
    open_query(request)
    row = request.app[FOLD].state.sources.get(request.match_info["url_id"])
    if row is None:
        raise ApiError(404, "not-found", "no such source")
    return reply(_source_json(row, source_score(row, now_ms())))


@routes.get("/v1/leases")
async def leases(request: web.Request) -> web.Response:
    open_query(request)
    state = request.app[FOLD].state
    now = now_ms()
    kind = request.query.get("kind")
    limit = integer(request, "limit", 1000) or 0
    rows = sorted(
        (r for r in state.leases.values() if kind is None or r.kind == kind),
        key=lambda r: r.target,
    )
    rows = rows[:limit] if limit else rows
    items = []
    for r in rows:
        item = msgspec.structs.asdict(r)
        if r.status == "leased" and not lease_live(r, now):
            item["status"] = "expired"
        items.append(item)
    return reply({"count": len(items), "leases": items})


@routes.get(ME_PATH)
async def whoami(request: web.Request) -> web.Response:
    """The agent behind a token: how `ppf agent` learns its own name, and the NATS URL
    with its own credentials (null: publish through ``POST /v1/events``)."""
    caller = authorize(request, "worker", "checker", "seed", "consumer")
    offer = request.app[CONFIG].agent_nats
    nats = None
    state = request.app[FOLD].state
    # No NATS login for consumers and admins, nor for an agent not trusted now: the
    # gateway is its door, where its bytes are bounded before the log keeps them.
    if (
        offer is not None
        and caller.role not in ("admin", "consumer")
        and not trust.untested(state, caller.name)
    ):
        # Its own credentials, minted from its current token: a new token or a
        # revocation makes them fail (gateway/natsauth.py).
        nats = offer.url_for(caller.name, caller.token_sha256)
        # A server listening on every address: reach it where the agent reached us.
        host = request.url.host or ""
        host = f"[{host}]" if ":" in host else host
        for unspecified in ("0.0.0.0:", "[::]:"):
            if unspecified in nats and host:
                nats = nats.replace(unspecified, f"{host}:")
    key = request.app[JUDGE_DOOR].keys.agent_key(caller.name).hex()
    row = state.agents.get(caller.name)
    return reply(
        AgentMe(
            name=caller.name,
            role=caller.role,
            nats=nats,
            judge_key=key,
            batches=state.settings.batches,
            skew_ms=state.skew.get(caller.name, 0),
            rejected=row.rejected if row is not None else 0,
            last_refusal=state.refusals.get(caller.name, ""),
        )
    )


@routes.get("/v1/agents")
async def agents(request: web.Request) -> web.Response:
    open_query(request)
    # What the bounds refused each (gateway/bounds.py): the admin's to see alone.
    admin = "Authorization" in request.headers and (
        authorize(request, *ROLE_EVENTS).role == ROLE_ADMIN
    )
    refusals = request.app[REFUSALS]
    state = request.app[FOLD].state
    now = now_ms()
    items = []
    for a in sorted(state.agents.values(), key=lambda a: a.name):
        item = msgspec.structs.asdict(a)
        del item["token_sha256"]
        item["trust"] = trust.level(state, a)  # and its spot-check record, in the row
        held = state.holders.get(a.name, set())
        item["active_leases"] = sum(1 for t in held if lease_live(state.leases[t], now))
        # Re-sends of what it sent before, met and ignored (reducers/marks.py): counted,
        # so an observation dropped can be told from a true re-send.
        item["resent"] = state.resent.get(a.name, 0)
        if refused := request.app[PAGES].refused.get(a.name, 0):
            item["deposits_refused"] = refused  # this gateway's (gateway/deposits.py)
        penalties = request.app[PENALTIES]
        if cut := penalties.cut_off.get(a.name, 0):  # this gateway's (gateway/penalty.py)
            item["cut_off"] = cut
            item["cut_off_s"] = round(penalties.penalized(a.name))
        if admin and (refused_by := refusals.of(a.name)):
            item["refused_by_bound"] = refused_by
        items.append(item)
    return reply({"count": len(items), "agents": items})
