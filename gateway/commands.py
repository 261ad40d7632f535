"""Agent and admin endpoints: publish observations, take and keep leases, add sources.

Everything here ends in the log: the gateway validates, publishes and, where the
answer depends on arbitration, waits until its own projection has applied the result.
"""

from __future__ import annotations

import re

import msgspec
import structlog
from aiohttp import web

from agents.seeds import source_added
from events import (
    OBSERVATIONS,
    AnyEvent,
    Event,
    Heartbeat,
    LeaseReset,
    ProxiesChecked,
    ProxyReported,
    Released,
    Settings,
    SitesChecked,
    SubjectError,
    agent_msg_id,
    subject_for,
    url_id,
)
from events.batches import TRAFFIC_KEY, expand
from events.mint import fresh_id, now_ms
from events.roles import ROLE_KINDS, may_publish
from events.validate import id_problem, problem, result_problems, url_problem
from events.wire import (
    EVENTS_PATH,
    EventsAccepted,
    EventsRequest,
    FieldError,
    HeartbeatReply,
    LeaseRequest,
    LeasesReply,
    ReleaseReply,
    ReleaseRequest,
    ReportReply,
    ReportRequest,
    SourcesAdded,
    SourcesRequest,
)
from gateway.bounds import REFUSALS, REPORTS_PER_HOUR
from gateway.http import (
    CONFIG,
    FOLD,
    LOG,
    ApiError,
    Caller,
    RateLimiter,
    authorize,
    client_address,
    decode_body,
    reply,
    retry_later,
)
from gateway.leases import Granter
from projections.core.readmodels import proxy_status
from reducers import trust
from reducers.pool import lease_live
from reducers.proxies import reports_left
from reducers.reports import ANONYMOUS

__all__ = [
    "ANONYMOUS_REPORTS",
    "GRANTER",
    "anonymous_reporter",
    "proxy_address",
    "publish_report",
    "routes",
]

routes = web.RouteTableDef()
GRANTER = web.AppKey("granter", Granter)
ANONYMOUS_REPORTS = web.AppKey("anonymous_reports", RateLimiter)  # keyed by client address
# Bytes for the log, keyed by actor (gateway/bounds.py): untested agents', consumers'.
UNTESTED_LOG = web.AppKey("untested_log", RateLimiter)
CONSUMER_LOG = web.AppKey("consumer_log", RateLimiter)
REPORTS = web.AppKey("reports", RateLimiter)  # consumers' blocked and worked reports
OBSERVATIONS_NAMES = frozenset(kind.__name__ for kind in OBSERVATIONS)


_event: msgspec.json.Decoder[Event] = msgspec.json.Decoder(AnyEvent)
_PATH = re.compile(r"at `\$(?P<path>[^`]*)`")


def _field(message: str) -> str:
    m = _PATH.search(message)
    return m.group("path").lstrip(".") if m else ""


def _check(caller: Caller, index: int, event: Event, settings: Settings) -> FieldError | None:
    """The fold's own rules (events/validate.py, under the log's settings), asked before
    publishing: what the fold would refuse is answered 400 here, naming the field."""
    lab, guarded, rule = settings.lab, settings.guarded, settings.address_rule
    if not may_publish(caller.role, type(event).__name__):
        return FieldError(
            index=index, field="type", reason=f"role {caller.role} may not publish it"
        )
    if event.agent != caller.name:
        return FieldError(index=index, field="agent", reason="must be the token's agent name")
    if not event.id:
        return FieldError(index=index, field="id", reason="must not be empty")
    try:
        subject_for(event)
    except SubjectError as exc:
        return FieldError(index=index, field="", reason=str(exc))
    field, why = problem(event, lab=lab, guarded=guarded, rule=rule)
    if why:
        return FieldError(index=index, field=field, reason=why)
    # The fold measures from the message's log time; ours is within ms of it.
    skew_ms = settings.id_skew_s * 1000
    if (
        guarded
        and type(event).__name__ in OBSERVATIONS_NAMES
        and (why := id_problem(event.id, now_ms(), skew_ms))
    ):
        return FieldError(index=index, field="id", reason=why)
    if isinstance(event, SitesChecked) and caller.role == "endpoint" and event.key != TRAFFIC_KEY:
        return FieldError(
            index=index, field="key", reason=f"an endpoint's rounds are keyed {TRAFFIC_KEY!r}"
        )
    if isinstance(event, ProxiesChecked):
        if caller.role == "consumer" and event.key != TRAFFIC_KEY:
            # Its rounds are its traffic's, on ppf.checked.traffic: never a checker's shard.
            return FieldError(
                index=index, field="key", reason=f"a consumer's rounds are keyed {TRAFFIC_KEY!r}"
            )
        # Each result as the single event it stands for: its facts, and what the
        # caller's role may say (a worker reports working proxies only).
        bad = result_problems(event, lab=lab, guarded=guarded, rule=rule)
        if bad:
            _, field, why = bad[0]
            return FieldError(index=index, field=field, reason=why)
        for j, single in enumerate(expand(event)):
            if caller.role == "consumer":
                break  # its traffic: worked and failed alike, folded as its reports
            if not may_publish(caller.role, type(single).__name__):
                return FieldError(
                    index=index,
                    field=f"results[{j}].ok",
                    reason=f"role {caller.role} may not report {type(single).__name__}",
                )
    return None


async def _foreign_release(request: web.Request, caller: Caller, event: Released) -> str:
    """Why ``event`` may not be published by ``caller`` ("" when it may): a release
    frees a lease, so only of a lease the caller holds, or of one that has ended on that
    target (a late release, which the fold counts as late). Anything else would free
    another agent's lease, or make a ledger row for a lease that never was."""
    fold = request.app[FOLD]
    state = fold.state

    def ended() -> bool:
        row = state.leases.get(event.target)
        return row is not None and row.lease == event.lease and row.status != "leased"

    if event.lease not in state.lease_owner:
        if ended():
            return ""
        # Granted a moment ago by another gateway, maybe, and not applied here yet (the
        # granting one applied it before answering): look once more at the head.
        await fold.caught_up_now(2.0)
    target = state.lease_owner.get(event.lease)
    if target is None:
        return "" if ended() else "no such lease on this target"
    if target != event.target or state.leases[target].holder != caller.name:
        return "a lease this agent does not hold"
    return ""


@routes.post(EVENTS_PATH)
async def publish_events(request: web.Request) -> web.Response:
    # A consumer publishes its traffic's rounds here, and the rotating endpoint its site verdicts.
    caller = authorize(request, "worker", "checker", "seed", "consumer", "endpoint")
    body = await decode_body(request, EventsRequest)
    limit = request.app[CONFIG].max_batch
    if len(body.events) > limit:
        raise ApiError(413, "batch-too-large", f"{len(body.events)} events; at most {limit}")
    events: list[Event] = []
    errors: list[FieldError] = []
    for index, raw in enumerate(body.events):
        try:
            event = _event.decode(raw)
        except msgspec.ValidationError as exc:
            errors.append(FieldError(index=index, field=_field(str(exc)), reason=str(exc)))
            continue
        except msgspec.DecodeError as exc:  # pragma: no cover - Raw is valid JSON already
            errors.append(FieldError(index=index, field="", reason=str(exc)))
            continue
        problem = _check(caller, index, event, request.app[FOLD].state.settings)
        why = ""
        if problem is None and isinstance(event, Released):
            why = await _foreign_release(request, caller, event)
        if why:
            problem = FieldError(index=index, field="lease", reason=why)
        if problem is not None:
            errors.append(problem)
        events.append(event)
    if errors:
        raise ApiError(
            400,
            "invalid-events",
            f"{len(errors)} of {len(body.events)} events are invalid; none was published",
            errors=errors,
        )
    if not events:
        return reply(EventsAccepted(seqs=[], duplicates=0))
    _charge_log_bytes(request, caller, sum(len(raw) for raw in body.events))
    # Duplicates as the stream counted them (an id it had already, from this batch, an
    # earlier one, or another agent's event): each stored nothing, and the caller is told.
    acks = await request.app[LOG].publish_acks(events, msg_id=agent_msg_id)
    duplicates = sum(a.duplicate for a in acks)
    return reply(EventsAccepted(seqs=[a.seq for a in acks], duplicates=duplicates))


def _charge_log_bytes(request: web.Request, caller: Caller, size: int) -> None:
    """Take ``size`` bytes from the caller's budget for the log, if it has one (an agent
    not trusted now, a consumer); 429 with the wait past it, counted and logged."""
    state = request.app[FOLD].state
    if caller.role == "consumer" and not (
        state.settings.guarded and caller.name in state.operators
    ):
        bucket = request.app[CONSUMER_LOG]
    elif caller.role in ("worker", "checker", "seed") and trust.untested(state, caller.name):
        bucket = request.app[UNTESTED_LOG]
    else:
        return  # the operator's own: its agents are not slowed
    wait = bucket.take(caller.name, size)
    if wait > 0:
        request.app[REFUSALS].refused(
            "log_bytes", caller.name, "over its bytes for the log", size=size
        )
        raise retry_later(
            wait, "log-budget", f"{caller.name} sent its bytes for the log; {size} more must wait"
        )


@routes.post("/v1/leases")
async def take_leases(request: web.Request) -> web.Response:
    caller = authorize(request, "worker", "checker", "seed")
    body = await decode_body(request, LeaseRequest)
    if body.agent != caller.name:
        raise ApiError(403, "forbidden", "agent must be the token's agent name")
    if caller.role != "admin" and ROLE_KINDS.get(caller.role) != body.kind:
        raise ApiError(403, "forbidden", f"role {caller.role} may not lease {body.kind} targets")
    if not 1 <= body.count <= 1_000:
        raise ApiError(400, "bad-parameter", "count: 1 to 1000", parameter="count")
    if body.ttl_s <= 0:
        raise ApiError(400, "bad-parameter", "ttl_s: > 0", parameter="ttl_s")
    grants = await request.app[GRANTER].grant(caller.name, body.kind, body.count, body.ttl_s)
    return reply(LeasesReply(leases=grants))


async def _held(request: web.Request, caller: Caller) -> tuple[str, str]:
    """(lease, target) when ``caller`` holds this lease now, else 409."""
    lease = request.match_info["lease"]
    structlog.contextvars.bind_contextvars(lease=lease)
    fold = request.app[FOLD]
    state = fold.state
    if lease not in state.lease_owner:
        # Granted ahead of this fold (a sure claim, gateway/leases.py) or by another
        # gateway, and not folded here yet: wait for the head as it is now (the cached
        # head may predate the grant: a release at once after it was then refused).
        await fold.caught_up_now(request.app[GRANTER].wait_s)
    target = state.lease_owner.get(lease)
    row = state.leases.get(target) if target is not None else None
    if row is None or not lease_live(row, now_ms()) or row.holder != caller.name:
        raise ApiError(409, "lease-lost", f"lease {lease} is not held by {caller.name}")
    return lease, row.target


async def _applied(request: web.Request, seq: int) -> None:
    if not await request.app[FOLD].wait_for(seq, request.app[GRANTER].wait_s):
        raise ApiError(503, "projection-lagging", "the projection has not applied the event yet")


@routes.post("/v1/leases/{lease}/heartbeat")
async def heartbeat(request: web.Request) -> web.Response:
    caller = authorize(request, "worker", "checker", "seed")
    lease, target = await _held(request, caller)
    event = Heartbeat(id=fresh_id(), agent=caller.name, at=now_ms(), leases=[lease])
    published = await request.app[LOG].publish(event)
    await _applied(request, published.seq)
    row = request.app[FOLD].state.leases[target]
    if row.lease != lease or row.status != "leased":
        raise ApiError(409, "lease-lost", f"lease {lease} expired before the heartbeat")
    return reply(HeartbeatReply(lease=lease, expires_at=row.expires_at))


@routes.post("/v1/leases/{lease}/release")
async def release(request: web.Request) -> web.Response:
    caller = authorize(request, "worker", "checker", "seed")
    lease, target = await _held(request, caller)
    body = await decode_body(request, ReleaseRequest) if request.can_read_body else ReleaseRequest()
    row = request.app[FOLD].state.leases[target]
    event = Released(
        id=fresh_id(),
        agent=caller.name,
        at=now_ms(),
        lease=lease,
        target=target,
        outcome=body.outcome,
        counted=body.counted,
        error=body.error,
        kind=row.kind,  # type: ignore[arg-type]
    )
    published = await request.app[LOG].publish(event)
    # No wait for the fold here: the release is in the log, which decides; the next
    # lease request reads the projection, which will have applied it or will soon.
    return reply(ReleaseReply(lease=lease, target=target, outcome=body.outcome, seq=published.seq))


@routes.post("/v1/proxies/{addr}/report")
async def report_proxy(request: web.Request) -> web.Response:
    """A consumer's word on a proxy it was served. ``failed``, within the consumer's
    hourly budget (429 past it): once guarded, the proxy is not served to that consumer
    again until a trusted check, goes first in the checkers' queue, and leaves alive for
    everyone within the consumer's share (reducers/reports.py); before, it left alive at
    once (reducers/proxies.py). ``worked`` is recorded and revives nothing. Without a
    token (guarded only), a report moves the proxy up the queue, budgeted per address."""
    if request.app[FOLD].state.settings.guarded and "Authorization" not in request.headers:
        name = anonymous_reporter(request)
    else:
        name = authorize(request, "consumer").name
    ip, port = proxy_address(request.match_info["addr"], "addr")
    body = await decode_body(request, ReportRequest)
    report = await publish_report(request, name, ip, port, body.outcome, body.detail, body.site)
    return reply(report)


def anonymous_reporter(request: web.Request) -> str:
    """``ANONYMOUS`` while the caller's address is within its budget of reports without
    a token; 429 past it."""
    wait = request.app[ANONYMOUS_REPORTS].take(client_address(request))
    if wait > 0:
        raise retry_later(
            wait, "report-budget", "too many reports without a token from this address"
        )
    return ANONYMOUS


def proxy_address(text: str, parameter: str) -> tuple[str, int]:
    """``ip:port`` (IPv6 in brackets or not) from a path or query parameter; 400 else."""
    ip, _, port = text.rpartition(":")
    if not ip or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ApiError(400, "bad-parameter", f"{parameter}: ip:port", parameter=parameter)
    return ip.strip("[]"), int(port)


async def publish_report(
    request: web.Request,
    name: str,
    ip: str,
    port: int,
    outcome: str,
    detail: str,
    site: str = "",
) -> ReportReply:
    """Publish ``name``'s report on a proxy of the pool, once the budgets allow it, and
    answer after the fold applied it (``report_proxy``, and ``/delete/`` of the drop-in
    calls for anonymous callers)."""
    state = request.app[FOLD].state
    guarded = state.settings.guarded
    key = (ip, port)
    if key not in state.proxies:
        raise ApiError(404, "not-found", f"no proxy {ip}:{port} in the pool")
    event = ProxyReported(
        id=fresh_id(),
        agent=name,
        at=now_ms(),
        ip=ip,
        port=port,
        outcome=outcome,  # type: ignore[arg-type]
        detail=detail,
        site=site,
    )
    field, why = problem(
        event, lab=state.settings.lab, guarded=guarded, rule=state.settings.address_rule
    )
    if why:
        raise ApiError(400, "bad-parameter", f"{field}: {why}", parameter=field)
    now = now_ms()
    budgeted = name != ANONYMOUS and not (guarded and name in state.operators)
    if budgeted and outcome == "failed" and not reports_left(state, state.agents.get(name), now):
        request.app[REFUSALS].refused("reports", name, "over its failed reports", ip=ip)
        budget = state.settings.report_budget_per_hour
        wait_s = max(1, ((now // 3_600_000 + 1) * 3_600_000 - now) // 1000)
        raise ApiError(
            429,
            "report-budget",
            f"{name} used its {budget} failed reports this hour",
            headers={"Retry-After": str(wait_s)},
        )
    if budgeted and outcome != "failed" and (wait := request.app[REPORTS].take(name)) > 0:
        # Its blocked and worked reports: the fold budgets only its failed ones.
        request.app[REFUSALS].refused("reports", name, f"over its {outcome} reports", ip=ip)
        raise retry_later(
            wait, "report-budget", f"{name} made its {REPORTS_PER_HOUR} reports this hour"
        )
    published = await request.app[LOG].publish(event)
    await _applied(request, published.seq)
    row = state.proxies.get(key)
    ttl = state.settings.proxy_ttl_s
    status = (
        "evicted"
        if row is None
        else proxy_status(row, now_ms(), ttl, trust.vouched(state)(row.agents))
    )
    left = reports_left(state, state.agents.get(name), now)
    return ReportReply(
        ip=ip, port=port, outcome=outcome, seq=published.seq, status=status, budget_left=left
    )


@routes.post("/v1/sources")
async def add_sources(request: web.Request) -> web.Response:
    caller = authorize(request, "admin")
    body = await decode_body(request, SourcesRequest)
    state = request.app[FOLD].state
    added, known, fresh = [], [], {}
    lab = state.settings.lab
    for url in body.urls:
        # The rule the fold applies to SourceAdded (events/validate.py): refused here
        # with its reason, never published to be refused there.
        settings = state.settings
        if why := url_problem(url, lab=lab, guarded=settings.guarded, rule=settings.address_rule):
            raise ApiError(400, "bad-url", f"{url[:200]!r}: {why}")
        uid = url_id(url)
        if uid in state.sources and state.sources[uid].url:
            known.append(uid)
            continue
        added.append(uid)
        fresh[url] = body.proto_hint
    events = source_added(fresh, "manual", agent=caller.name)
    if events:
        await request.app[LOG].publish_many(events)
    return reply(SourcesAdded(added=added, known=known))


@routes.post("/v1/targets/{kind}/{target}/reset")
async def reset_target(request: web.Request) -> web.Response:
    caller = authorize(request, "admin")
    kind = request.match_info["kind"]
    if kind not in ("source", "recheck", "seed"):
        raise ApiError(400, "bad-parameter", "kind: source, recheck or seed", parameter="kind")
    event = LeaseReset(
        id=fresh_id(),
        agent=caller.name,
        at=now_ms(),
        target=request.match_info["target"],
        kind=kind,  # type: ignore[arg-type]
    )
    try:
        published = await request.app[LOG].publish(event)
    except SubjectError as exc:
        raise ApiError(400, "bad-target", str(exc)) from None
    await _applied(request, published.seq)
    return reply({"target": event.target, "seq": published.seq})
