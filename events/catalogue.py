"""The event catalogue: every observation the fleet can publish, as one tagged union.

Rules of evolution (docs/architecture.md §2): add fields only at the end and only with
defaults; never change a field's type or reuse a tag. A breaking change is a new tag plus an
upcaster in ``codec``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from events.sites import SiteRule

__all__ = [
    "EVENT_TYPES",
    "LAST_FIRST_SETTING",
    "OBSERVATIONS",
    "AgentEnrolled",
    "Anonymity",
    "AnyEvent",
    "CheckResult",
    "Configured",
    "DepositFolded",
    "DepositRejected",
    "Deposited",
    "Discovered",
    "Event",
    "Extracted",
    "Fetched",
    "Heartbeat",
    "LeaseKind",
    "LeaseReset",
    "Leased",
    "Located",
    "Origin",
    "Outcome",
    "Place",
    "ProxiesChecked",
    "ProxyFailed",
    "ProxyReported",
    "ProxyWorked",
    "Released",
    "Reported",
    "Role",
    "SeedKind",
    "SeedPlanned",
    "Settings",
    "SiteResult",
    "SiteRuled",
    "SitesChecked",
    "SourceAdded",
    "Tried",
]

# "proxy": a consumer's exclusive checkout of one proxy (POST /v1/checkout).
LeaseKind = Literal["source", "recheck", "seed", "proxy"]
Outcome = Literal["done", "failed", "abandoned"]
Reported = Literal["worked", "failed", "blocked"]
Origin = Literal["seed", "discovered", "manual"]
SeedKind = Literal["proxies", "sources"]
Anonymity = Literal["transparent", "anonymous", "elite", ""]
# Whether a proxy tunnelled to a real HTTPS target: "yes", "no", or "" (not tried).
Tried = Literal["yes", "no", ""]
Role = Literal["worker", "checker", "seed", "consumer", "endpoint", "admin", "gateway", "fold"]

SCHEMA_VERSION = 1


# The last setting the first logs were written with. Every setting declared after it is
# left out of the meta digest while at its default (reducers/state.py ``settings_part``),
# so a log written before it keeps its digest: a new setting goes at the end, with the
# default that keeps the rule as it was.
LAST_FIRST_SETTING = "provenance_cap"


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Every setting that changes what a reducer does (docs/architecture.md §3, Settings)."""

    lab: bool = False
    ema_alpha: float = 0.3
    min_interval_s: int = 300
    max_interval_s: int = 86_400
    attempt_budget: int = 5
    lease_ttl_min_s: int = 10
    lease_ttl_max_s: int = 3_600
    proxy_ttl_s: int = 14_400
    latency_samples: int = 16
    provenance_cap: int = 16
    # Identity bound to the publisher (docs/architecture.md §5): from the Configured
    # that sets it, agents publish only on ``ppf.in.<agent>.<entity>.<key>`` and the
    # entity subjects are the service's. Off in logs written before it existed, which
    # replay as they always did.
    agent_subjects: bool = False
    # Workers earn trust (reducers/trust.py): from the Configured that sets ``trust``, a
    # proxy is served only once an agent trusted now has confirmed it. ``trusted_agents``
    # are the operator's own (``ppf up``'s, and those ``ppf token trust`` marks); their
    # checks are the spot-checks that let any other agent earn trust or lose it.
    trust: bool = False
    trusted_agents: tuple[str, ...] = ()
    spot_window_s: int = 1_800  # a check this soon after a report tests the report
    spot_share: float = 0.25  # of an untested agent's reports, checked at once
    trust_after: int = 10  # spot-checks before trust is earned or lost
    trust_margin: float = 0.2  # failing this much more often than the baseline loses it
    # Per agent, for every agent but the trusted ones (0: no limit); past them its
    # events go to the DLQ as ``quota``.
    quota_events_per_min: int = 3_000
    quota_proxies_per_hour: int = 20_000
    quota_sources_per_hour: int = 2_000
    # Failed reports per consumer per hour that take a proxy out of alive (ProxyReported):
    # one token cannot empty the pool.
    report_budget_per_hour: int = 100
    # Rechecks (projections/core/recheck.py): a proxy whose latest check failed comes back
    # after failing_s, doubling with each further failure up to dead_s (dead ones
    # rarely); fresh (few confirmations) and flapping ones every fresh_s; settled ones
    # every settled_s, and those alive for over a day every veteran_s. The budget caps
    # the checks a gateway hands out an hour (0: no cap); the intervals stay as they are,
    # the most overdue go first.
    recheck_failing_s: int = 300
    recheck_fresh_s: int = 900
    recheck_settled_s: int = 3_600
    recheck_veteran_s: int = 7_200
    recheck_dead_s: int = 21_600
    recheck_budget_per_hour: int = 0
    # The re-send mark (reducers/marks.py): 0 keeps the highest id per agent, as logs
    # written before this setting did; N keeps each agent's N newest ids, so ids out of
    # order (within a millisecond, two processes on one token, clocks apart) are folded.
    resend_window: int = 0
    # The re-send window in log time (reducers/marks.py ``Recent``): from the Configured
    # that sets it, it takes over from ``resend_window``. An agent's ids folded within
    # the last W seconds of log time are remembered; an id dated before that is stale.
    resend_window_s: int = 0
    # Agents, the deposit ingest and the locator publish a round's results as one
    # ProxiesChecked and many locations as one Located (docs/architecture.md §3).
    batches: bool = False
    # What a hostile probe found (docs/trust.md "Guarded"): from the Configured that sets
    # it, the fold refuses to the DLQ, with its reason and in the agent's ``rejected``,
    # ports outside 1-65535, addresses that cannot be public proxies, observations whose
    # UUIDv7 id is dated more than ``id_skew_s`` past their message's log time, and
    # source URLs whose host only looks public (events/hosts.py); a re-issued token
    # clears its agent's future-dated ids from its mark; an untrusted consumer's failed
    # reports take at most ``report_share`` of the alive pool out of it an hour
    # (reducers/proxies.py). Needs ``agent_subjects`` (the admission the rules live in).
    guarded: bool = False
    id_skew_s: int = 300
    report_share: float = 0.02
    # The address rule's revision (events/address.py): 0 as the fold answered before this
    # setting (Python 3.11.7's answers, written out); 1 the IANA registries, multicast
    # refused, IPv6 forms that embed an IPv4 judged by it, more internal names refused.
    address_rule: int = 0
    # Quality signals (reducers/quality.py): from the Configured that sets it, the checks
    # of agents trusted then are folded into each proxy's time up and time known by
    # log-time day, the start of its unbroken run of successes, and its download speed.
    quality: bool = False
    # Sites' room kept for the trusted (reducers/sites.py): from the Configured that sets
    # it, an agent not trusted then makes no new cell but on the operator's targets
    # (``ppf sites add``): its verdicts on other sites count on cells already kept, or
    # are counted as not kept. One untested checker's invented sites took every slot.
    site_cells_guarded: bool = False
    # Learning that never stops (reducers/sites.py): from the Configured that sets it, a
    # new site finds room in a full table by evicting the lowest ranked site (operator's
    # targets first, then the latest traffic to it, then its latest verdict, in log time;
    # ties by name) when the new one outranks it. Before, the first sites kept their
    # slots for good, and a pool that had run a while learned no new site.
    site_eviction: bool = False
    # Verdicts charged and kept to targets (reducers/admission.py): from the Configured
    # that sets it, each verdict of a SitesChecked round counts against its agent's
    # ``quota_events_per_min`` (a round past the quota is refused whole; before, a round
    # of 500 counted as one event), and a round of an agent not trusted then that names a
    # site other than the operator's targets is refused (``forbidden``, in the DLQ).
    verdicts_guarded: bool = False


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """The envelope every event carries.

    ``at`` is the producer's clock (unix ms) and only informational: reducers use the
    JetStream server timestamp of the message instead.
    """

    id: str
    agent: str
    at: int
    v: int = SCHEMA_VERSION


class SourceAdded(Event, frozen=True, kw_only=True, tag="SourceAdded"):
    url: str
    url_id: str
    proto_hint: str = ""
    origin: Origin = "manual"
    parent: str = ""


class Leased(Event, frozen=True, kw_only=True, tag="Leased"):
    lease: str
    kind: LeaseKind
    target: str
    ttl_s: int
    # A checkout's id (kind "proxy"): the claims of one POST /v1/checkout, found again by
    # it for 24 h of log time whoever asks with the same idempotency key.
    checkout: str = ""


class Heartbeat(Event, frozen=True, kw_only=True, tag="Heartbeat"):
    leases: list[str] = []
    # The sender's own way out is down (no judge, no canary answers): what it sees, or
    # "" once it is back. Its failures then blame no source and no proxy.
    outage: str = ""


class Released(Event, frozen=True, kw_only=True, tag="Released"):
    lease: str
    target: str
    outcome: Outcome
    counted: bool = True
    error: str = ""
    # Needed to derive the subject ppf.lease.<kind>.<target>; §4 lists only target.
    kind: LeaseKind = "source"


class LeaseReset(Event, frozen=True, kw_only=True, tag="LeaseReset"):
    target: str
    kind: LeaseKind = "source"


class Fetched(Event, frozen=True, kw_only=True, tag="Fetched"):
    url_id: str
    lease: str = ""
    ok: bool
    error: str = ""
    http_status: int = 0
    content_hash: str = ""
    bytes: int = 0
    fetch_ms: int = 0
    changed: bool = False


class Extracted(Event, frozen=True, kw_only=True, tag="Extracted"):
    url_id: str
    content_hash: str = ""
    count: int
    candidates: list[tuple[str, int, str, float]] = []
    extractor: str = ""
    lease: str = ""


class ProxyWorked(Event, frozen=True, kw_only=True, tag="ProxyWorked"):
    ip: str
    port: int
    proto: str
    latency_ms: int
    exit_ip: str = ""
    anonymity: Anonymity = ""
    mitm: bool = False
    source: str = ""
    judge: str = ""
    lease: str = ""
    https: Tried = ""
    # Kilobytes a second of a bounded download from ppf's judge through it, as this
    # agent's vantage saw it (0: not measured); folded once ``quality`` is set.
    speed_kb_s: int = 0


class ProxyFailed(Event, frozen=True, kw_only=True, tag="ProxyFailed"):
    ip: str
    port: int
    proto: str
    error: str = ""
    lease: str = ""


class ProxyReported(Event, frozen=True, kw_only=True, tag="ProxyReported"):
    """A consumer's word on a proxy it was served (POST /v1/proxies/{ip}:{port}/report);
    ``blocked``: ``site`` turned it away (reducers/sites.py), not the proxy's failure."""

    ip: str
    port: int
    outcome: Reported
    detail: str = ""
    site: str = ""


class Deposited(Event, frozen=True, kw_only=True, tag="Deposited"):
    lease: str = ""
    key: str
    sha256: str
    bytes: int
    items: int = 0
    cursor: int | None = None


class DepositFolded(Event, frozen=True, kw_only=True, tag="DepositFolded"):
    key: str
    attempt: int = 1
    reason: str = ""


class DepositRejected(Event, frozen=True, kw_only=True, tag="DepositRejected"):
    key: str
    attempt: int = 1
    reason: str = ""


class Discovered(Event, frozen=True, kw_only=True, tag="Discovered"):
    parent: str
    urls: list[str]


class SeedPlanned(Event, frozen=True, kw_only=True, tag="SeedPlanned"):
    """A bulk import cut into ranges of its input's items (lines); every plan of the same
    input carries all its ranges so far, so the last one tells what is covered."""

    plan: str
    input: str  # the deposit key of the input (``input/<sha256>``)
    ranges: list[tuple[str, int, int]]  # [range, first item, last item]
    kind: SeedKind = "proxies"
    priority: int = 0  # larger goes first, never more than half of the work in flight


class AgentEnrolled(Event, frozen=True, kw_only=True, tag="AgentEnrolled"):
    name: str
    role: Role
    token_sha256: str


class Configured(Event, frozen=True, kw_only=True, tag="Configured"):
    settings: Settings


class Place(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One more address of a ``Located`` batch, with its location (same data version)."""

    ip: str
    country: str = ""
    asn: int = 0
    as_org: str = ""


class Located(Event, frozen=True, kw_only=True, tag="Located"):
    """Country and network of an address, looked up once by the service (offline data
    whose version is ``geo``), so replay needs no data file. From the ``batches``
    setting the service sends many at once: the first in the fields, the rest in
    ``more``."""

    ip: str
    country: str = ""  # ISO 3166 alpha-2; "" when the data has none
    asn: int = 0  # 0 when the data gives no number (geoip2fast gives names only)
    as_org: str = ""
    geo: str = ""
    more: list[Place] = []


class CheckResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One proxy's check in a round (``ProxiesChecked``): what a ``ProxyWorked`` (``ok``)
    or a ``ProxyFailed`` (not ``ok``) says, without the envelope the round carries."""

    ip: str
    port: int
    proto: str
    ok: bool = True
    latency_ms: int = 0
    exit_ip: str = ""
    anonymity: Anonymity = ""
    mitm: bool = False
    https: Tried = ""
    judge: str = ""
    error: str = ""
    speed_kb_s: int = 0


class ProxiesChecked(Event, frozen=True, kw_only=True, tag="ProxiesChecked"):
    """The results of one check round under one lease: a worker's of one source
    (``key`` and ``source`` its url_id), a checker's of one shard (``key`` the shard),
    the fold's of one deposit (``key`` its key id). Folded result by result, each as
    the ``ProxyWorked`` or ``ProxyFailed`` it stands for (``events.batches.expand``)."""

    key: str
    results: list[CheckResult]
    lease: str = ""
    source: str = ""


class SiteRuled(Event, frozen=True, kw_only=True, tag="SiteRuled"):
    """The operator's rule for reading a site's answers (``ppf sites add``; events/sites.py
    ``SiteRule``), on the site's own subject; ``removed``: back to the built-in or generic
    reading."""

    rule: SiteRule
    removed: bool = False
    # The operator's URL of its target (``ppf sites add URL``): the fleet's probes of the
    # site ask its path there ("" : the site's root). Kept apart from the rule, which
    # the endpoints and agents read: where the operator looks is the operator's.
    url: str = ""


class SiteResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One proxy's answers from one site in a round (``SitesChecked``): how many got the
    site's page and how many were turned away (answers with no verdict are not counted;
    events/sites.py), and the latest answer's status class (2 for a 2xx; 0: none), its
    latency and its bytes. The site is its key (events/sites.py ``site_key_ok``), never a
    URL: what was asked stays with whoever asked it."""

    ip: str
    port: int
    site: str
    through: int = 0
    blocked: int = 0
    status: int = 0
    latency_ms: int = 0
    bytes: int = 0


class SitesChecked(Event, frozen=True, kw_only=True, tag="SitesChecked"):
    """Site verdicts of one round: a checker's probes of its shard (``key`` the shard).
    ``psl``: the public suffix list's version the sites were named by; ``reader``: the
    version of the block-page reading the verdicts were made by (events/blockpages.py)."""

    key: str
    results: list[SiteResult]
    lease: str = ""
    psl: str = ""
    reader: str = ""


AnyEvent = (
    SourceAdded
    | Leased
    | Heartbeat
    | Released
    | LeaseReset
    | Fetched
    | Extracted
    | ProxyWorked
    | ProxyFailed
    | ProxyReported
    | Deposited
    | DepositFolded
    | DepositRejected
    | Discovered
    | SeedPlanned
    | AgentEnrolled
    | Configured
    | Located
    | ProxiesChecked
    | SitesChecked
    | SiteRuled
)

EVENT_TYPES: tuple[type[Event], ...] = (
    SourceAdded,
    Leased,
    Heartbeat,
    Released,
    LeaseReset,
    Fetched,
    Extracted,
    ProxyWorked,
    ProxyFailed,
    ProxyReported,
    Deposited,
    DepositFolded,
    DepositRejected,
    Discovered,
    SeedPlanned,
    AgentEnrolled,
    Configured,
    Located,
    ProxiesChecked,
    SitesChecked,
    SiteRuled,
)

# What agents observe and send through their outboxes: the events a re-send can repeat
# and a quota counts.
OBSERVATIONS: tuple[type[Event], ...] = (
    Fetched,
    Extracted,
    ProxyWorked,
    ProxyFailed,
    ProxiesChecked,
    SitesChecked,
    Deposited,
    Discovered,
)
