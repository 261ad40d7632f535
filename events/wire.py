"""The HTTP wire between agents and the gateway: request and response bodies, typed.

Pure msgspec Structs that ``gateway/`` serves and ``agents/`` read, so both sides decode
the same types (requests reject unknown fields; replies are read leniently,
so a newer gateway may add fields). ``gateway/api.py`` builds the OpenAPI document from
them. Every error either side raises about this wire derives from ``WireError``.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any, Literal

import msgspec

from events.sites import SiteRule

__all__ = [
    "AGENT_HEADER",
    "ENDPOINT_FIGURES_PATH",
    "EVENTS_PATH",
    "MAX_NONCE",
    "MAX_TOKEN",
    "ME_PATH",
    "NONCE_GRACE_S",
    "NONCE_LIFETIME_S",
    "OPERATOR",
    "PROXIES_PATH",
    "SITE_CHANGES_PATH",
    "SITE_RULES_PATH",
    "AgentMe",
    "CheckoutProxy",
    "CheckoutRelease",
    "CheckoutReply",
    "CheckoutRequest",
    "DepositReply",
    "EndpointFigures",
    "EventsAccepted",
    "EventsRequest",
    "FieldError",
    "HeartbeatReply",
    "LeaseGrant",
    "LeaseRequest",
    "LeasesReply",
    "Problem",
    "ProxiesPage",
    "ProxyOut",
    "ProxyPayload",
    "ProxyRoute",
    "RecheckPayload",
    "ReleaseReply",
    "ReleaseRequest",
    "ReportReply",
    "ReportRequest",
    "SeedBatch",
    "SeedFound",
    "SeedPayload",
    "SiteChanges",
    "SiteRules",
    "SourcePayload",
    "SourcesAdded",
    "SourcesRequest",
    "WireError",
    "judge_nonce",
    "judge_sign",
    "nonce_parts",
    "nonce_tag_ok",
]

Kind = Literal["source", "recheck", "seed", "proxy"]
DEFAULT_LEASE_TTL_S = 300  # what an agent asks for when it says nothing
# What a seed node asks for a range: a range is long work, and a node that dies holds it
# this long before another resumes it from its cursor.
SEED_LEASE_TTL_S = 900


class LeaseRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    agent: str
    kind: Kind
    count: int = 1
    ttl_s: int = DEFAULT_LEASE_TTL_S


class SourcePayload(msgspec.Struct, kw_only=True):
    """What a worker needs to fetch a source."""

    url: str
    last_hash: str = ""
    proto_hint: str = ""
    priority: float = 0.0


class RecheckPayload(msgspec.Struct, kw_only=True):
    """A recheck shard's due proxies: ``[ip, port, proto]`` each, and what each took to
    check as the pool knows it (its latency EMA, ms; 0 unknown), in the same order
    (``[]`` from a gateway before it was sent); and the TARGET probes due in it,
    ``[ip, port, proto, site]`` each (the site's root, asked through the proxy: ``[]``
    from a gateway before probes), and where the operator gave a target's URL, the path
    a probe of that site asks (``paths``, by site; the root for any other)."""

    shard: str
    proxies: list[tuple[str, int, str]] = []
    latency_ms: list[int] = []
    probes: list[tuple[str, int, str, str]] = []
    paths: dict[str, str] = {}


class SeedPayload(msgspec.Struct, kw_only=True):
    """A seed range: its items from the resume cursor to its end (lines of the plan's
    input, ``items[0]`` is item ``cursor``), and where its batches go."""

    cursor: int
    end: int
    plan: str = ""
    range: str = ""
    kind: str = "proxies"
    items: list[str] = []


class SeedFound(msgspec.Struct, array_like=True):
    """One working proxy of a seed batch: what a ``ProxyWorked`` says of it."""

    ip: str
    port: int
    proto: str
    latency_ms: int = 0
    exit_ip: str = ""
    anonymity: str = ""
    mitm: bool = False
    judge: str = ""
    https: str = ""


class SeedBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a seed node deposits for items ``start`` .. ``next - 1`` of its range: the
    proxies that worked (kind proxies) or the URLs that are proxy lists (kind sources).
    Every other item was tried and is settled by the batch, so none is tried twice."""

    start: int
    next: int
    worked: list[SeedFound] = []
    sources: list[str] = []
    refused: int = 0  # items not tried: excluded, private or reserved, not an address


class DepositReply(msgspec.Struct, kw_only=True):
    """PUT /v1/deposits/{key}: stored and verified; the agent announces it next with
    ``Deposited`` (its own event, in its own numbering)."""

    key: str
    sha256: str
    bytes: int


class ProxyPayload(msgspec.Struct, kw_only=True):
    """A checked-out proxy (lease kind "proxy"): its consumer's alone until released."""

    ip: str
    port: int
    proto: str


class CheckoutRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/checkout``: proxies for one consumer alone, until released or expired.
    The same ``idempotency_key`` (1-64 of A-Z a-z 0-9 _ -) returns the same checkout for
    24 h at least."""

    count: int = 1
    ttl_s: int = 300
    idempotency_key: str = ""
    proto: str = ""
    country: list[str] = []
    anonymity: str = ""
    https: bool = False
    max_latency_ms: int = 0
    works_on: list[str] = []  # site keys it must get through to, each of them
    # Quality signals, as GET /v1/proxies takes them (0: not asked; ``datacenter`` "true"
    # or "false", "": either).
    min_uptime: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    stable_for_s: Annotated[int, msgspec.Meta(ge=0)] = 0
    min_speed_kb_s: Annotated[int, msgspec.Meta(ge=0)] = 0
    datacenter: Literal["", "true", "false"] = ""


class CheckoutProxy(msgspec.Struct, kw_only=True):
    ip: str
    port: int
    proto: str
    lease: str
    expires_at: int
    held: bool  # still this consumer's now


class CheckoutReply(msgspec.Struct, kw_only=True):
    checkout: str
    proxies: list[CheckoutProxy]


class CheckoutRelease(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/checkout/{id}/release``: ``outcomes`` by ``ip:port``, ``worked`` or
    ``failed`` (folded as the consumer's reports); every proxy of it is released."""

    outcomes: dict[str, Literal["worked", "failed"]] = {}


class LeaseGrant(msgspec.Struct, kw_only=True):
    lease: str
    epoch: int
    kind: Kind
    target: str
    expires_at: int
    # One of the payload Structs above by ``kind``; kept as a plain object on the wire
    # (the contract's shape), read back typed with ``source()`` or ``recheck()``.
    payload: dict[str, Any]

    def source(self) -> SourcePayload:
        return msgspec.convert(self.payload, SourcePayload)

    def recheck(self) -> RecheckPayload:
        return msgspec.convert(self.payload, RecheckPayload)

    def seed(self) -> SeedPayload:
        return msgspec.convert(self.payload, SeedPayload)


class LeasesReply(msgspec.Struct, kw_only=True):
    leases: list[LeaseGrant]


class HeartbeatReply(msgspec.Struct, kw_only=True):
    lease: str
    expires_at: int


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    outcome: Literal["done", "failed", "abandoned"] = "done"
    counted: bool = True
    error: str = ""


class ReportRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/proxies/{ip}:{port}/report: a consumer's word on a proxy it was served."""

    outcome: Literal["worked", "failed", "blocked"]
    detail: str = ""
    site: str = ""  # with "blocked": the site that turned the proxy away


class ReportReply(msgspec.Struct, kw_only=True):
    ip: str
    port: int
    outcome: str
    seq: int
    status: str  # the proxy's status once the report was applied
    # Failed reports of this consumer that can still act this hour (of log time).
    budget_left: int


class ReleaseReply(msgspec.Struct, kw_only=True):
    lease: str
    target: str
    outcome: str
    seq: int


class EventsRequest(msgspec.Struct, forbid_unknown_fields=True):
    events: list[msgspec.Raw]


class EventsAccepted(msgspec.Struct, kw_only=True):
    seqs: list[int]
    duplicates: int


class SourcesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    urls: list[str]
    proto_hint: str = ""


class SourcesAdded(msgspec.Struct, kw_only=True):
    added: list[str]
    known: list[str]


class AgentMe(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GET /v1/agents/me``: who a token is, the NATS URL its role publishes through
    (None: publish through ``POST /v1/events``), and its key for ppf's public judge
    (hex; "" where the gateway publishes none)."""

    name: str
    role: str
    nats: str | None  # always sent, null included
    judge_key: str = ""  # left out when empty
    # Report a check round as one ProxiesChecked (the fleet's batches setting); left
    # out when false, so older agents read the reply as they did.
    batches: bool = False
    # What an agent may do wrong without seeing it (all left out when 0 or ""): its
    # clock minus the log's at its latest observation (ms), its events the fold refused
    # (``rejected``, as in /v1/agents), and the latest reason.
    skew_ms: int = 0
    rejected: int = 0
    last_refusal: str = ""


# -- what the rotating endpoint reads of the gateway (endpoint/feed.py, endpoint/share.py)

PROXIES_PATH = "/v1/proxies"
ME_PATH = "/v1/agents/me"
EVENTS_PATH = "/v1/events"
SITE_RULES_PATH = "/v1/sites/rules"
SITE_CHANGES_PATH = "/v1/sites/changes"
ENDPOINT_FIGURES_PATH = "/v1/endpoints/figures"


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
    # projections/core/quality.py: None where nothing is known (no AS, no figure).
    datacenter: bool | None = None
    uptime_pct: float | None = None
    uptime_checks: int | None = None  # the checks uptime_pct is of
    stable_since: int | None = None
    speed_kb_s: int | None = None


# The fields of a row the endpoint routes by, taken from ``ProxyOut`` (declared there
# once): decoded alone, a pool of 100,000 rows takes about 90 ms where the whole row
# takes 160; their defaults read a gateway from before a field was added.
_ROUTE = (
    "ip", "port", "proto", "latency_ms", "anonymity", "mitm", "https", "country", "asn",
    "exit_ip", "last_seen",
)  # fmt: skip
_ZERO: dict[Any, Any] = {str: "", int: 0, float: 0.0, bool: False}
ProxyRoute = msgspec.defstruct(
    "ProxyRoute",
    [
        (f.name, f.type) if f.name in ("ip", "port", "proto") else (f.name, f.type, _ZERO[f.type])
        for f in msgspec.structs.fields(ProxyOut)
        if f.name in _ROUTE
    ],
    gc=False,
)


class ProxiesPage(msgspec.Struct):
    """``GET /v1/proxies`` as JSON (``format=ndjson``: a ``ProxyOut`` a line instead)."""

    count: int
    proxies: list[msgspec.Raw]


class SiteChanges(msgspec.Struct):
    """``GET /v1/sites/changes``: ``cells`` ``[ip, port, site, standing]`` moved after
    ``since``, as of ``now`` (log time, ms)."""

    now: int
    cells: list[tuple[str, int, str, str]]


class SiteRules(msgspec.Struct):
    """``GET /v1/sites/rules``: the operator's rules for reading sites' answers."""

    rules: list[SiteRule]


class EndpointFigures(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/endpoints/figures``: what one process of an endpoint did since it
    started (its outcomes, as its ``/metrics`` counts them), and its latencies to a first
    byte since its last report; each of ``ppf serve``'s workers reports its own."""

    process: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    counts: Annotated[dict[str, Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=64)]
    first_byte_ms: Annotated[
        list[Annotated[float, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=1_000)
    ]


_JSON = msgspec.json.Encoder()


def judge_sign(key: bytes, nonce: str, remote: str, path: str, headers: list[list[str]]) -> str:
    """The HMAC ppf's public judge puts in its answer: over the nonce and everything it
    echoed, in one encoding judge and agent make alike (``gateway/judge.py``)."""
    return hmac.new(key, _JSON.encode([nonce, remote, path, headers]), hashlib.sha256).hexdigest()


# How long a judge nonce may be used (from its minting), and the clock difference
# between agent and judge a judge forgives at either end.
NONCE_LIFETIME_S = 120
NONCE_GRACE_S = 60
# Who mints nonces that are the operator's own commands' (ppf check, ppf judges, ppf
# bench check), with the data dir's key: a name no agent can have (events/subjects.py).
OPERATOR = "~operator"


def judge_nonce(agent: str, key: bytes, judge: str, expires_s: int, random_part: str) -> str:
    """``<agent>.<expires>.<random>.<tag>``: a nonce for the judge at ``judge`` (its
    ``host:port`` as the agent addresses it), usable until unix time ``expires_s``; the
    tag is an HMAC under the agent's judge key over all of it."""
    return f"{agent}.{expires_s}.{random_part}.{_nonce_tag(key, judge, expires_s, random_part)}"


def _nonce_tag(key: bytes, judge: str, expires_s: int, random_part: str) -> str:
    said = f"{judge.lower()}|{expires_s}|{random_part}".encode()
    return hmac.new(key, said, hashlib.sha256).hexdigest()[:32]


# An agent's name (64), the expiry (12 digits), the random part (64), the tag (32).
MAX_NONCE = 64 + 12 + 64 + 32 + 3
MAX_TOKEN = 256  # characters of a bearer token or a login's password (ppf's own: 43)
# The agent a bearer token is said to be (optional): a gateway that has not folded the
# token's enrolment yet looks it up under this name before it answers 401.
AGENT_HEADER = "Ppf-Agent"


def nonce_parts(nonce: str) -> tuple[str, int, str, str] | None:
    """(agent, expires_s, random, tag) of a nonce in ``judge_nonce``'s form, else None:
    also for one longer than any ppf mints (refused before it is split)."""
    if len(nonce) > MAX_NONCE:
        return None
    parts = nonce.split(".")
    if len(parts) != 4 or not all(parts) or not parts[1].isdigit() or len(parts[1]) > 12:
        return None
    if len(parts[0]) > 64 or len(parts[2]) > 64 or len(parts[3]) != 32:
        return None
    return parts[0], int(parts[1]), parts[2], parts[3]


def nonce_tag_ok(key: bytes, judge: str, parts: tuple[str, int, str, str]) -> bool:
    _, expires_s, random_part, tag = parts
    return hmac.compare_digest(_nonce_tag(key, judge, expires_s, random_part), tag)


class FieldError(msgspec.Struct, kw_only=True):
    index: int
    field: str
    reason: str


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] = []
    parameter: str = ""


class WireError(Exception):
    """An answer that is not the one asked for: ``status`` (0 when nobody answered) and
    what was said. The gateway raises it to answer with a problem; an agent gets it."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
