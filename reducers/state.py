"""The rows every projection keeps, and the container the fold mutates.

Rows are plain msgspec Structs (``gc=False``: they hold only strings, numbers and
tuples, never cycles, and a million of them must stay cheap). Collections inside a
row are tuples in insertion order, so a row's canonical encoding is deterministic.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgspec

from events.catalogue import Settings
from reducers import geo, pool, trust
from reducers.marks import Mark, Recent
from reducers.pool import Composition

__all__ = [
    "MAX_SAMPLE_MS",
    "AgentRow",
    "DepositRow",
    "LeaseRow",
    "ProxyKey",
    "ProxyRow",
    "SourceRow",
    "State",
    "latency_samples",
    "unpack_samples",
]

ProxyKey = tuple[str, int]
MAX_SAMPLE_MS = 65_535


def latency_samples(row: ProxyRow) -> list[int]:
    return unpack_samples(row.samples)


def unpack_samples(data: bytes) -> list[int]:
    """The packed little-endian uint16 latency samples of a row, as milliseconds."""
    n = len(data) // 2
    unpack = _UNPACK.get(n)
    if unpack is None:
        unpack = _UNPACK[n] = struct.Struct(f"<{n}H").unpack
    return list(unpack(data if len(data) == 2 * n else data[: 2 * n]))


_UNPACK: dict[int, Callable[[bytes], tuple[int, ...]]] = {}  # by sample count


class ProxyRow(msgspec.Struct, gc=False):
    ip: str
    port: int
    proto: str
    protos: tuple[str, ...]
    first_seen: int
    last_seen: int
    last_failed: int = 0
    confirmations: int = 0
    fail_streak: int = 0
    latency_ema: float = 0.0
    # The last latency samples, little-endian uint16 each (ms, capped at 65535): bytes
    # cost 2 bytes a sample where a tuple of ints cost 36, and a million rows add up.
    samples: bytes = b""
    exit_ip: str = ""
    anonymity: str = ""
    mitm: bool = False
    agents: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    country: str = ""
    asn: int = 0
    https: str = ""  # yes, no, "" (never tried): a check that did not try leaves it
    as_org: str = ""
    geo: str = ""  # the version of the data country and as_org came from
    # Log time of the latest consumer report that it failed (ProxyReported) that took it
    # out of alive: checked ahead of routine rechecks until a check comes after it.
    reported_at: int = 0
    # Times it came back after failing (projections/recheck.py: flapping proxies are
    # rechecked often).
    flaps: int = 0
    # The agents whose checks failed it since its last success (at most four): how many
    # vantages saw it die (projections/recheck.py: a network's outage seen from one
    # checker only is confirmed by another where one exists).
    failed_by: tuple[str, ...] = ()


class SourceRow(msgspec.Struct, gc=False):
    url_id: str
    url: str
    proto_hint: str = ""
    origin: str = "manual"
    parent: str = ""
    added_at: int = 0
    check_time: int = 0  # 0: never fetched
    check_interval: int = 3_600
    consecutive_errors: int = 0
    error: int = 0
    stale_count: int = 0
    retrievals: int = 0
    proxies_added: int = 0
    yield_rate: float = 0.0
    working_ratio: float = 0.0
    avg_fetch_time: float = 0.0
    last_hash: str = ""
    last_worker: str = ""
    last_error: str = ""
    # The fetch in progress: its lease, what it extracted, the distinct proxies that
    # worked from it. Settled into working_ratio when the lease ends.
    cur_lease: str = ""
    cur_candidates: int = 0
    cur_working: tuple[str, ...] = ()


class LeaseRow(msgspec.Struct, gc=False):
    target: str
    kind: str
    status: str = "free"  # free, leased, failed
    holder: str = ""
    lease: str = ""
    epoch: int = 0  # stream sequence of the granting Leased: the fencing token
    leased_at: int = 0
    expires_at: int = 0
    ttl_s: int = 0
    attempts: int = 0
    cursor: int = 0
    end: int = 0
    last_error: str = ""
    lost: int = 0
    start: int = 0  # a seed range's first item
    priority: int = 0  # a seed range's plan's priority (SeedPlanned.priority)
    input: str = ""  # a seed range's plan's input (its deposit key)
    input_kind: str = ""  # what its items are: proxies, sources
    # Stream sequence of the last message on this target's lease subject: what a
    # gateway sets as Nats-Expected-Last-Subject-Sequence when it claims the target.
    subject_seq: int = 0


class DepositRow(msgspec.Struct, gc=False):
    """A deposit the log announced (``Deposited``) and what the fold made of it."""

    key: str
    sha256: str
    bytes: int = 0
    items: int = 0
    agent: str = ""
    lease: str = ""
    target: str = ""  # a seed batch's range ("" for pages and inputs)
    start: int = 0  # a seed batch's first item and the one after its last
    next: int = 0
    seq: int = 0  # of the Deposited that announced it (the latest, when announced again)
    at: int = 0
    status: str = "pending"  # pending, folded, poisoned
    attempts: int = 0  # failed reads so far (DepositRejected), across announcements
    tried: int = 0  # ``attempts`` when last announced: each gets its own budget
    reason: str = ""


class AgentRow(msgspec.Struct, gc=False):
    name: str
    role: str = ""
    token_sha256: str = ""
    enrolled_at: int = 0
    last_seen: int = 0
    counts: dict[str, int] = {}
    lost: int = 0
    late: int = 0
    rejected: int = 0
    outage: str = ""  # its own network is down (Heartbeat.outage), "" when it is not
    outage_since: int = 0
    # Earned trust (reducers/trust.py): "" untested, "earned", "fallen"; the spot-checks
    # of its reports by the operator's own agents, and how many of them failed.
    standing: str = ""
    spot_checks: int = 0
    spot_failed: int = 0
    # Quota windows: the minute and hour (of log time) being counted, and the counts.
    quota_minute: int = 0
    quota_events: int = 0
    quota_hour: int = 0
    quota_proxies: int = 0
    quota_sources: int = 0
    # A consumer's failed reports that acted, in the hour (of log time) being counted.
    report_hour: int = 0
    reports_acted: int = 0


class State:
    """Everything the reducers fold into, with the keys changed since the last checkpoint.

    Agents are few (one row per enrolled machine) and touched by every event, so they
    carry no dirty set: each checkpoint writes them all.
    """

    __slots__ = (
        "agents",
        "by_ip",
        "checked_out",
        "checkouts",
        "composition",
        "deposits",
        "dirty_deposits",
        "dirty_leases",
        "dirty_proxies",
        "dirty_sources",
        "doubted",
        "doubts",
        "failing",
        "high_water",
        "holders",
        "judges",
        "last_seq",
        "lease_owner",
        "leases",
        "marks",
        "operators",
        "pending_deposits",
        "proxies",
        "recent",
        "refusals",
        "resent",
        "settings",
        "settings_dirty",
        "skew",
        "sources",
        "sweep_bucket",
        "takes",
        "tokens",
        "trust_base",
        "trusted",
        "unlocated",
    )

    def __init__(self) -> None:
        self.proxies: dict[ProxyKey, ProxyRow] = {}
        self.sources: dict[str, SourceRow] = {}
        self.leases: dict[str, LeaseRow] = {}
        self.agents: dict[str, AgentRow] = {}
        self.deposits: dict[str, DepositRow] = {}
        # Derived: keys announced and neither folded nor poisoned yet, what the deposit
        # ingest reads (never a listing of the bucket).
        self.pending_deposits: set[str] = set()
        # Derived indexes (never persisted, rebuilt by reindex): current lease id -> its
        # target; agent -> targets it holds (live or not yet seen to expire); token
        # SHA-256 -> agent name.
        self.lease_owner: dict[str, str] = {}
        self.holders: dict[str, set[str]] = {}
        self.tokens: dict[str, str] = {}
        # The pool's composition by last_seen bucket (reducers/pool.py), kept by deltas;
        # and the same counts of the rows whose latest check failed (suspect while seen
        # within the TTL), so /v1/stats counts what /v1/proxies serves.
        self.composition = Composition()
        self.failing = Composition()
        # ip -> (its location or None, the ports of its rows) (reducers/geo.py), and the
        # addresses no Located has reached yet: what the service still has to look up.
        self.by_ip: dict[str, tuple[Any, tuple[int, ...]]] = {}
        self.unlocated: set[str] = set()
        # agent -> the highest event id of its observations folded so far: a re-send,
        # however late, is ignored (reducers/fold.py). One id per agent, not per event.
        self.high_water: dict[str, str] = {}
        # From the resend_window setting, the mark is a window of each agent's newest
        # ids instead (reducers/marks.py); persisted and digested like high_water.
        self.marks: dict[str, Mark] = {}
        # From the resend_window_s setting, a window of log time instead: each agent's
        # ids with the log time each is forgotten at (reducers/marks.py ``Recent``).
        self.recent: dict[str, Recent] = {}
        # agent -> re-sends met and ignored by this replica since it started: a count
        # for /v1/agents and /v1/stats, neither persisted nor digested (a re-send
        # changes no projection: its digest is the log's without it).
        self.resent: dict[str, int] = {}
        # Also per replica and not digested, for an agent to learn what it does wrong
        # (GET /v1/agents/me): its clock minus log time at its latest observation (ms),
        # and the latest reason the fold refused one of its events.
        self.skew: dict[str, int] = {}
        self.refusals: dict[str, str] = {}
        # Trust (reducers/trust.py): whose confirmations put a proxy in the served pool
        # (the operator's agents and those that earned it), whose checks are spot-checks
        # (the operator's), both derived; and the baseline those checks set: [checks of
        # proxies a trusted agent had just confirmed, how many failed], persisted in meta.
        self.trusted: frozenset[str] = frozenset()
        self.judges: frozenset[str] = frozenset()
        self.operators: frozenset[str] = frozenset()  # settings.trusted_agents, as a set
        self.trust_base = [0, 0]
        # Consumers' failed reports once guarded (reducers/reports.py): proxy -> the
        # consumers it is kept from until a trusted check; consumer -> [hour, proxies it
        # took out of alive that hour, its cap]; both persisted in meta and digested.
        # ``doubts`` is ``doubted`` by consumer, derived.
        self.doubted: dict[ProxyKey, tuple[str, ...]] = {}
        self.takes: dict[str, list[int]] = {}
        self.doubts: dict[str, set[ProxyKey]] = {}
        # Checkouts (reducers/ledger.py, lease kind "proxy"): id -> [log time of its
        # first claim, the consumer, its leases' ids, their targets], kept 48 h of log
        # time, persisted in meta and digested; and the proxy targets leased, derived.
        self.checkouts: dict[str, list[Any]] = {}
        self.checked_out: set[str] = set()
        self.settings = Settings()
        self.last_seq = 0
        self.sweep_bucket = 0
        self.dirty_proxies: set[ProxyKey] = set()
        self.dirty_sources: set[str] = set()
        self.dirty_leases: set[str] = set()
        self.dirty_deposits: set[str] = set()
        self.settings_dirty = False

    def reindex(self, counted: tuple[Composition, Composition] | None = None) -> None:
        """Rebuild derived indexes after a restore; ``counted``: the composition and its
        failing part when the caller has counted them already (``pool.counted``)."""
        self.lease_owner = {}
        self.holders = {}
        self.checked_out = set()
        for row in self.leases.values():
            if row.status == "leased" and row.lease:
                self.lease_owner[row.lease] = row.target
                self.holders.setdefault(row.holder, set()).add(row.target)
                if row.kind == "proxy":
                    self.checked_out.add(row.target)
        self.tokens = {a.token_sha256: a.name for a in self.agents.values() if a.token_sha256}
        self.pending_deposits = {k for k, d in self.deposits.items() if d.status == "pending"}
        trust.reindex(self)
        self.doubts = {}
        for key, names in self.doubted.items():
            for name in names:
                self.doubts.setdefault(name, set()).add(key)
        self.composition, self.failing = counted or pool.counted(self.proxies.values())
        self.by_ip = {}
        self.unlocated = set()
        for proxy in self.proxies.values():
            geo.admitted(self, proxy)

    def mark_all_dirty(self) -> None:
        """Every row changed: the next checkpoint writes them all (a state loaded from a
        snapshot, into a fresh file)."""
        self.dirty_proxies = set(self.proxies)
        self.dirty_sources = set(self.sources)
        self.dirty_leases = set(self.leases)
        self.dirty_deposits = set(self.deposits)
        self.settings_dirty = True

    def clear_dirty(self) -> None:
        self.dirty_proxies = set()
        self.dirty_sources = set()
        self.dirty_leases = set()
        self.dirty_deposits = set()
        self.settings_dirty = False
