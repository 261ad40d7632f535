"""Read endpoints: the pool, sources, leases, agents. Memory only: no DuckDB, no NATS."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import structlog
from aiohttp import web

from events.mint import now_ms
from events.subjects import proxy_of
from events.wire import AgentMe
from gateway.deposits import PAGES
from gateway.formats import FORMATS
from gateway.http import CONFIG, FOLD, ApiError, authorize, choice, integer, open_query, reply
from gateway.judge import JUDGE_DOOR
from gateway.penalty import PENALTIES
from projections.foreground import Foreground, drive
from projections.poolview import (
    CENSUS_MS,
    PoolView,
    ProxyView,
    building,
    dropping,
    held,
)
from projections.readmodels import (
    ProxyFilter,
    due_sources,
    nearest_rank,
    source_score,
    status_at,
)
from reducers import ProxyRow, State, trust
from reducers.pool import lease_live
from reducers.reports import hidden_from
from reducers.state import latency_samples, unpack_samples

__all__ = ["POOL_VIEW", "PoolViewKeeper", "routes"]

routes = web.RouteTableDef()
log = structlog.get_logger("ppf.gateway")


class PoolViewKeeper:
    """Holds the current pool view; rebuilds it when the fold moved and it is stale.

    Stale means older than ``1 / share`` times its own build took (within ``min_age_s``
    and ``max_age_s``), so rebuilding takes at most ``share`` of the event loop's time: a
    small pool's view follows the fold within a tenth of a second (a death served a
    second longer cost the churn lab's precision), a million proxies' (seconds to build)
    is not rebuilt every second while the fold moves. A build gives the loop back every
    ``slice_s`` (``projections.poolview.building``), so the other requests (a lease,
    /v1/stats) are answered meanwhile. One build at a time.
    """

    def __init__(
        self,
        *,
        share: float = 0.1,
        min_age_s: float = 0.1,
        max_age_s: float = 30.0,
        slice_s: float = 0.002,
        wait_s: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
        foreground: Foreground | None = None,
    ) -> None:
        self.share, self.min_age_s, self.max_age_s = share, min_age_s, max_age_s
        # A build nobody waits for (a big pool's) and the old views' release yield to
        # the requests in flight between their steps; a build a request waits for not.
        self.foreground = foreground
        self.slice_s, self.wait_s = slice_s, wait_s
        self.clock = clock
        self.current: PoolView | None = None
        self._built = 0.0
        self._age_s = min_age_s  # how long the current one stays fresh
        self._took = 0.0  # the loop's time the last build took, its slices summed
        self._rows = 0  # the proxies it built from
        self._task: asyncio.Task[PoolView] | None = None
        self._retiring: set[asyncio.Task[tuple[None, float]]] = set()

    async def get(self, request: web.Request) -> PoolView:
        return await self.view(request.app[FOLD].state)

    def stale(self, state: State) -> bool:
        view = self.current
        if view is None:
            return True
        return view.seq != state.last_seq and self.clock() - self._built >= self._age_s

    async def view(self, state: State, *, idle: bool | None = None) -> PoolView:
        """The current view, or a newer one when one is due and cheap to build.

        Due: for a query (``idle`` None), once the current one is stale; for /v1/stats,
        which says the ``seq`` it saw, never while the fold moves (``idle`` False) and
        as soon as it moved once the fold is idle (True). A build that last took at most
        ``wait_s`` (a small pool's) is waited for; a longer one (a big pool's) runs
        while the current view answers: every await costs a round of the loop's
        other work (the fold's slices, the build's own), and a query at 100,000 proxies
        that waited for a build took 660 ms at p99 (``ppf bench stats``)."""
        view = self.current
        if view is None:
            return await asyncio.shield(self._start(state))
        if view.seq == state.last_seq or idle is False:
            return view
        cheap = self._cheap(state)
        if not (self.stale(state) or (idle and cheap)):
            return view
        task = self._start(state)
        if cheap:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.wait_s)
        return self.current or view

    def _cheap(self, state: State) -> bool:
        """Whether the next build is one to wait for: the last one was short and the pool
        has not grown much since (a catch-up that brings a hundred thousand proxies
        into a pool of ten would otherwise be waited for on the last one's figure)."""
        return self._took <= self.wait_s and len(state.proxies) <= 2 * self._rows + 1_024

    def _start(self, state: State) -> asyncio.Task[PoolView]:
        if self._task is None or self._task.done():
            waited = self.current is None or self._cheap(state)
            self._task = asyncio.get_running_loop().create_task(self._build(state, waited))
        return self._task

    async def _build(self, state: State, waited: bool) -> PoolView:
        fg = None if waited else self.foreground
        rows = len(state.proxies)
        view, self._took = await drive(building(state, now_ms()), self.slice_s, self.clock, fg)
        self._rows = rows
        self._built = self.clock()
        old, self.current = self.current, view  # readers see the old or the new one
        self._age_s = min(self.max_age_s, max(self.min_age_s, self._took / self.share))
        if old is not None:
            # Freeing a hundred thousand views at once held the loop 36 ms: the parts
            # that hold them go a step at a time (unless a request still reads the old
            # one), and with them the views.
            holding, old = held(old), None
            task = asyncio.get_running_loop().create_task(
                drive(dropping(holding), self.slice_s, self.clock, self.foreground)
            )
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return view


POOL_VIEW = web.AppKey("pool_view", PoolViewKeeper)
_encode = msgspec.json.Encoder().encode
_json_lines = msgspec.json.Encoder().encode_lines


class ProxyOut(msgspec.Struct):
    """One proxy as ``GET /v1/proxies`` serves it (a Struct: encoded in C, no dict a row)."""

    ip: str
    port: int
    proto: str
    protos: tuple[str, ...]
    status: str
    last_seen: int
    first_seen: int
    latency_ms: float
    latency_p50_ms: int | None
    latency_p95_ms: int | None
    exit_ip: str
    anonymity: str
    mitm: bool
    https: str
    confirmations: int
    agents: int
    sources: tuple[str, ...]
    fail_streak: int
    country: str
    asn: int
    as_org: str


def _view_json(v: ProxyView | ProxyRow, now: int, ttl: int, confirmed: bool = True) -> ProxyOut:
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
    )


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


def _filter(request: web.Request) -> ProxyFilter:
    # Proxies seen tampering with pages or certificates are left out unless asked for:
    # mitm=true serves only them, mitm=any serves everything.
    mitm = choice(request, "mitm", ("false", "true", "any"), "false")
    https = request.query.get("https")
    if https not in (None, "true", "false"):
        raise ApiError(400, "bad-parameter", "https: true or false", parameter="https")
    latency = integer(request, "max_latency_ms")
    return ProxyFilter(
        proto=request.query.get("proto") or None,
        country=_countries(request.query.get("country")),
        as_org=request.query.get("as_org") or None,
        asn=integer(request, "asn"),
        anonymity=request.query.get("anonymity") or None,
        max_latency_ms=float(latency) if latency is not None else None,
        status=choice(
            request, "status", ("alive", "suspect", "unconfirmed", "stale", "dead", "all"), "alive"
        ),
        fresh_s=integer(request, "fresh_s"),
        mitm=None if mitm == "any" else mitm == "true",
        https=None if https is None else https == "true",
    )


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


@routes.get("/v1/proxies")
async def proxies(request: web.Request) -> web.StreamResponse:
    hidden = hidden_for(request)
    f = _filter(request)
    sort = choice(request, "sort", ("latency", "last_seen"), "latency")
    fmt = choice(request, "format", ("json", "ndjson", "txt", *FORMATS), "json")
    limit = integer(request, "limit", 100) or 0
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
    # joined as the one array they are the pieces of (projections/chunks.py does the same
    # with msgpack).
    pieces = []
    for start in range(0, len(views), ANSWER_CHUNK):
        rows = [_view_json(v, now, view.ttl_s) for v in views[start : start + ANSWER_CHUNK]]
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
            await response.write(_json_lines([_view_json(v, now, ttl_s) for v in chunk]))
            await asyncio.sleep(0)
        await response.write_eof()
    except ConnectionResetError:  # the client went away mid-answer: nothing to say to it
        log.info("answer_abandoned", path=request.path, by="client")
    return response


# Rows of a pool's answer made at a time: the whole pool in one go (the rotating
# endpoint's feed asks for all of it every 5 s) held the loop 600-700 ms at 100,000
# proxies, stalling every other request for as long.
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
    body = msgspec.structs.asdict(_view_json(row, now_ms(), state.settings.proxy_ttl_s, confirmed))
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


@routes.get("/v1/agents/me")
async def whoami(request: web.Request) -> web.Response:
    """The agent behind a token: how `ppf agent` learns its own name, and the NATS URL
    with its own credentials (null: publish through ``POST /v1/events``)."""
    caller = authorize(request, "worker", "checker", "seed", "consumer")
    offer = request.app[CONFIG].agent_nats
    nats = None
    if offer is not None and caller.role not in ("admin", "consumer"):  # no NATS login
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
    state = request.app[FOLD].state
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
        items.append(item)
    return reply({"count": len(items), "agents": items})
