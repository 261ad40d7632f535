"""What every handler shares: JSON replies, problem+json errors, parameters, auth, limits."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import structlog
from aiohttp import web

from eventlog.protocol import DepositStore, EventLog, LogError
from events import AgentEnrolled, agent_name_ok, token_sha256
from events.subjects import enrolment_subject
from events.wire import AGENT_HEADER, MAX_TOKEN, FieldError, Problem, WireError
from gateway.bounds import RateLimiter
from gateway.diskguard import DiskGuard
from gateway.judge import JudgeDoor
from gateway.natsauth import NatsAuth
from gateway.penalty import PENALTIES
from gateway.rechecks import Probing
from projections.core.recheck import RecheckPolicy
from projections.live import LAG_BOUND, FoldService

__all__ = [
    "AUTH_FAILURES",
    "CONFIG",
    "FOLD",
    "LIMITER",
    "LOG",
    "TRUSTED",
    "ApiError",
    "Caller",
    "GatewayConfig",
    "Param",
    "RateLimiter",
    "authorize",
    "choice",
    "client_address",
    "decode_body",
    "integer",
    "middleware",
    "reply",
    "retry_later",
]

T = TypeVar("T")
_json = msgspec.json.Encoder()
log = structlog.get_logger("ppf.gateway")

ROLE_ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Gateway settings that shape requests, not projections (so not in the log)."""

    private_queries: bool = False
    max_batch: int = 1_000
    max_body: int = 4 * 1024 * 1024
    rate_per_s: float = 2_000.0
    burst: float = 4_000.0
    max_leases_per_agent: int = 64
    lag_bound: int = LAG_BOUND
    # None: the intervals the log's settings give (Configured recheck_*); a policy here
    # overrides them (tests that need everything due now).
    recheck: RecheckPolicy | None = None
    # Which checkers probe which sites, and how often a site is probed (gateway/rechecks.py).
    probing: Probing = field(default_factory=Probing)
    series_every_s: float = 10.0
    # How agents reach NATS with their own credentials (gateway/natsauth.py); None: they
    # publish through POST /v1/events.
    agent_nats: NatsAuth | None = None
    # Wrong tokens per client address: a burst answered 401, then one per 5 s; the rest
    # 429, each answered after ``auth_failure_delay_s`` (a guesser is slowed; tokens are
    # 256 random bits, which is what protects them). A valid token is never refused for
    # what others sent from its address (a NAT, a shared host, a reverse proxy).
    auth_failures_burst: float = 20.0
    auth_failures_per_s: float = 0.2
    auth_failure_delay_s: float = 0.5
    # Addresses (or networks) of the reverse proxies in front of this gateway: only from
    # them is X-Forwarded-For believed, for the client's address (``client_address``).
    trusted_proxies: tuple[str, ...] = ()
    # Reports without a token (POST /v1/proxies/{addr}/report, the drop-in /delete/) per
    # client address: a burst, then this many an hour; each only moves a proxy up the
    # checkers' queue (reducers/reports.py).
    anonymous_reports_burst: float = 10.0
    # The rotating endpoint's counts, where it runs in this process (ppf up): /metrics
    # reports them (gateway/metrics.py).
    endpoint_outcomes: Any = None
    anonymous_reports_per_hour: float = 60.0
    # Who the judges answer (gateway/judge.py), shared by every listener of /judge so a
    # nonce is spent on all of them; agents get their keys with GET /v1/agents/me.
    # None: /judge answers nobody.
    judge: JudgeDoor | None = None
    # The deposit bucket (eventlog/objects.py): seed batches and pages are stored through
    # this gateway (gateway/deposits.py); None: it takes none.
    deposits: DepositStore | None = None
    # Pauses seed leases while the store holds too much of its disk (gateway/diskguard.py);
    # None: no guard (the store's disk is not this machine's to weigh).
    disk_guard: DiskGuard | None = None


FOLD = web.AppKey("fold", FoldService)
LOG = web.AppKey("log", EventLog)
CONFIG = web.AppKey("config", GatewayConfig)


class ApiError(WireError):
    """Raised by handlers; rendered as application/problem+json with a stable type."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        *,
        errors: list[FieldError] | None = None,
        parameter: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, detail)
        self.kind = kind
        self.errors = errors or []
        self.parameter = parameter
        self.headers = headers or {}

    def response(self) -> web.Response:
        """The problem as the client gets it (application/problem+json)."""
        body = Problem(
            type=f"https://ppf.dev/problems/{self.kind}",
            title=self.kind.replace("-", " "),
            status=self.status,
            detail=self.detail,
            errors=self.errors,
            parameter=self.parameter,
        )
        return web.Response(
            body=_json.encode(body),
            status=self.status,
            content_type="application/problem+json",
            headers=self.headers,
        )


def reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


@web.middleware
async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Problems for every error, and one log line per request.

    Every request is logged at debug; refusals, failures and slow answers at info and
    up, so a busy gateway (thousands of lease requests a second) logs what matters.
    """
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(peer=client_address(request))
    started = time.perf_counter()
    await _newly_issued(request)  # not in the foreground: it waits for the fold to move
    with request.app[FOLD].foreground.running():  # the fold waits for it between slices
        response = await _answer(request, handler)
    ms = round((time.perf_counter() - started) * 1000, 2)
    status = response.status
    level = "debug" if status < 400 and ms < 100 else "warning" if status >= 500 else "info"
    getattr(log, level)(
        "request_answered", method=request.method, path=request.path, status=status, ms=ms
    )
    return response


# How long a request with a token not folded yet waits for the fold to reach it.
ENROLMENT_WAIT_S = 2.0


async def _newly_issued(request: web.Request) -> None:
    """A bearer token the fold does not know may have been issued a moment ago
    (``ppf token issue`` speaks only to the log): before ``authorize`` answers 401, the
    enrolment is looked for in the log, by a direct get on the subject of the agent the
    request names (``Ppf-Agent``), and the fold is waited for up to it; without a name,
    or under another last message, up to the log's head as it is now. Only while the
    caller's address has failed logins left (a guesser's are refused unlooked-for), and
    never past ``ENROLMENT_WAIT_S``."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or len(token) > MAX_TOKEN:
        return
    digest = token_sha256(token)
    fold = request.app[FOLD]
    if digest in fold.state.tokens or request.app[AUTH_FAILURES].wait(client_address(request)):
        return
    name = request.headers.get(AGENT_HEADER, "")
    try:
        if agent_name_ok(name):
            found = await fold.log.last_entry(enrolment_subject(name), wait_s=0.0)
            if found is not None:
                seq, event = found
                if isinstance(event, AgentEnrolled) and event.token_sha256 == digest:
                    await fold.wait_for(seq, ENROLMENT_WAIT_S)
                    return
        await fold.caught_up_now(ENROLMENT_WAIT_S)
    except Exception as exc:  # a courtesy: whatever fails, the token is judged by the fold
        log.info("enrolment_lookup_failed", error=repr(exc))


async def _answer(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except LogError as exc:  # the log is the one dependency every write goes through
        return ApiError(503, "log-unavailable", str(exc)).response()
    except ApiError as exc:
        if exc.kind == "too-many-failures":  # a guesser waits for its answer
            await asyncio.sleep(request.app[CONFIG].auth_failure_delay_s)
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = (exc.reason or "error").lower().replace(" ", "-")
        keep = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return ApiError(
            exc.status, kind, exc.text or exc.reason or "error", headers=keep
        ).response()
    except Exception:  # a bug: still a problem body, and a log line to find it by
        log.exception("request_failed", path=request.path, method=request.method)
        return ApiError(500, "internal-error", "the gateway failed on this request").response()


async def decode_body(request: web.Request, kind: type[T]) -> T:
    """The request body as ``kind``, or a 400/413 problem that says what is wrong."""
    max_body = request.app[CONFIG].max_body
    if request.content_length is not None and request.content_length > max_body:
        raise ApiError(413, "too-large", f"body over {max_body} bytes")
    data = await request.read()
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "invalid-body", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "undecodable-body", str(exc)) from None
    except RecursionError:  # JSON nested past the decoder's depth: the client's fault
        raise ApiError(400, "undecodable-body", "JSON nested too deep") from None


def integer(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        detail = f"{name}: not an integer: {raw!r}"
        raise ApiError(400, "bad-parameter", detail, parameter=name) from None
    if value < 0:
        raise ApiError(400, "bad-parameter", f"{name}: must be >= 0", parameter=name)
    return value


def choice(request: web.Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in allowed:
        detail = f"{name}: one of {', '.join(allowed)}"
        raise ApiError(400, "bad-parameter", detail, parameter=name)
    return value


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter, declared once: how it is read and what the API document says
    of it. ``choices``: the values it takes, in the order the document lists them."""

    name: str
    integer: bool = False  # a count or bound: >= 0
    choices: tuple[str, ...] = ()
    default: Any = None

    def read(self, request: web.Request) -> Any:
        if self.integer:
            return integer(request, self.name, self.default)
        if self.choices:
            if self.default is None and self.name not in request.query:
                return None
            return choice(request, self.name, self.choices, self.default)
        return request.query.get(self.name) or self.default

    def openapi(self) -> dict[str, Any]:
        if self.integer:
            schema: dict[str, Any] = {"type": "integer", "minimum": 0}
        elif self.choices:
            schema = {"enum": list(self.choices)}
        else:
            schema = {"type": "string"}
        return {"name": self.name, "in": "query", "required": False, "schema": schema}


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: str
    token_sha256: str


LIMITER = web.AppKey("limiter", RateLimiter)
AUTH_FAILURES = web.AppKey("auth_failures", RateLimiter)  # keyed by peer address


def authorize(request: web.Request, *roles: str) -> Caller:
    """The caller behind the bearer token, if its role is one of ``roles`` (admin: all)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "unauthorized",
            "a bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # No token ppf issues is longer: a longer one is refused unread, as a wrong one is.
    digest = token_sha256(token) if len(token) <= MAX_TOKEN else ""
    state = request.app[FOLD].state
    name = state.tokens.get(digest)
    if name is None:
        peer = client_address(request)
        wait = request.app[AUTH_FAILURES].take(peer)
        log.warning("auth_failed", peer=peer, path=request.path, refused=wait > 0)
        if wait > 0:
            raise retry_later(wait, "too-many-failures", "too many wrong tokens from this address")
        raise ApiError(401, "unauthorized", "unknown or revoked token")
    structlog.contextvars.bind_contextvars(agent=name)
    if (cut_off := request.app.get(PENALTIES)) is not None and (left := cut_off.penalized(name)):
        why = f"{name} is cut off for its refused input, {int(left)} s more"
        raise ApiError(403, "cut-off", why, headers={"Retry-After": str(max(1, round(left)))})
    agent = state.agents[name]
    if agent.role != ROLE_ADMIN and agent.role not in roles:
        raise ApiError(403, "forbidden", f"role {agent.role} may not do this")
    wait = request.app[LIMITER].take(digest)
    if wait > 0:
        raise retry_later(wait, "rate-limited", "too many requests for this token")
    return Caller(name=name, role=agent.role, token_sha256=digest)


def retry_later(wait_s: float, kind: str, detail: str) -> ApiError:
    """The 429 a limiter's ``wait_s`` (RateLimiter.take) answers, with its Retry-After."""
    return ApiError(429, kind, detail, headers={"Retry-After": str(max(1, round(wait_s)))})


def client_address(request: web.Request) -> str:
    """Who is asking: the peer, or, when the peer is a proxy the operator named
    (``trusted_proxies``), the nearest address in X-Forwarded-For that is not one."""
    peer = request.remote or "unknown"
    trusted = request.app[TRUSTED]
    if not trusted or not _within(peer, trusted):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getall("X-Forwarded-For", [])).split(",")]
    for hop in reversed([h for h in hops if h]):
        if not _within(hop, trusted):
            return hop if _address(hop) else peer
    return peer


def _within(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    ip = _address(address)
    return ip is not None and any(ip in net for net in networks if net.version == ip.version)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
TRUSTED = web.AppKey("trusted_proxies", tuple)  # of IPNetwork, from the config


def open_query(request: web.Request) -> None:
    """Queries are open unless the gateway was told to keep them private."""
    if request.app[CONFIG].private_queries:
        authorize(request, "worker", "checker", "seed", "consumer")
