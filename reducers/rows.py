"""The rows of the fold's tables, and the small typed values its meta keeps.

Rows are plain msgspec Structs (``gc=False``: they hold only strings, numbers and
tuples, never cycles, and a million of them must stay cheap). Collections inside a
row are tuples in insertion order, so a row's canonical encoding is deterministic.
The values of the meta (``Checkout``, ``Take``, ``TrustBase``) are ``array_like``:
they encode as the positional arrays they were before they had names, so the digest
of a log is the same.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Callable, Iterable
from typing import Any, cast

import msgspec

__all__ = [
    "MAX_SAMPLE_MS",
    "MAX_UINT32",
    "MAX_VANTAGES",
    "AgentRow",
    "Checkout",
    "DepositRow",
    "Int64s",
    "LeaseRow",
    "ProxyKey",
    "ProxyQuality",
    "ProxyRow",
    "SiteCells",
    "SiteKey",
    "SiteProxy",
    "SourceRow",
    "Take",
    "TrustBase",
    "UInt16s",
    "UInt32s",
    "decode_column",
    "encode_column",
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
    # Times it came back after failing (projections/core/recheck.py: flapping proxies are
    # rechecked often).
    flaps: int = 0
    # The agents whose checks failed it since its last success (at most four): how many
    # vantages saw it die (projections/core/recheck.py: a network's outage seen from one
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
    # worked from it. Settled into working_ratio when the lease ends. A list, grown in
    # place: a fetch's confirmations sent one by one copied a tuple of all found so far
    # at each (stored as the tuple was: the same array in the checkpoint and digest).
    cur_lease: str = ""
    cur_candidates: int = 0
    cur_working: list[str] = []


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


SiteKey = tuple[str, int, str]  # ip, port, site


class Int64s(array.array):  # type: ignore[type-arg]
    """A column of 64-bit integers (``SiteCells``): 8 bytes a value, not an object."""

    def __new__(cls, values: Iterable[int] | bytes = b"") -> Int64s:
        return cast(Int64s, super().__new__(cls, "q", values))


class UInt32s(array.array):  # type: ignore[type-arg]
    """A column of counts (``SiteCells``), held at ``MAX_UINT32`` rather than wrapped."""

    def __new__(cls, values: Iterable[int] | bytes = b"") -> UInt32s:
        return cast(UInt32s, super().__new__(cls, "I", values))


class UInt16s(array.array):  # type: ignore[type-arg]
    """A column of 16-bit numbers (``SiteCells.vantages``, ``SiteCells.nos``)."""

    def __new__(cls, values: Iterable[int] | bytes = b"") -> UInt16s:
        return cast(UInt16s, super().__new__(cls, "H", values))


MAX_UINT32 = 0xFFFF_FFFF
MAX_VANTAGES = 4  # the agents a cell names (reducers/sites.py)
_COLUMNS = (Int64s, UInt32s, UInt16s)


def encode_column(value: Any) -> Any:
    """msgspec's ``enc_hook``: a column as its bytes, little-endian (as every host ppf
    runs on keeps them; a big-endian one swaps), so a row's encoding is canonical."""
    if isinstance(value, _COLUMNS):
        if sys.byteorder == "big":
            value = type(value)(value)
            value.byteswap()
        return memoryview(value).cast("B")
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def decode_column(kind: type, value: Any) -> Any:
    """msgspec's ``dec_hook``: a column from the bytes ``encode_column`` wrote."""
    if kind in _COLUMNS and isinstance(value, bytes):
        column = kind(value)
        if sys.byteorder == "big":
            column.byteswap()
        return column
    raise NotImplementedError(f"cannot decode {kind.__name__}")


class SiteCells(msgspec.Struct, gc=False):
    """The cells of one site over one run of proxy numbers (reducers/sites.py): a column
    a field, a cell an index, in the order of the proxies' numbers (``SiteProxy``). Per
    cell: its number's place in the run, the log time of the latest answer through and
    of the latest block an agent trusted then saw, how many of each any agent saw, and
    which agents (at most ``MAX_VANTAGES`` codes a cell: 1 + an index into ``agents``, 0
    for none). 34 bytes a cell, where a Struct a cell cost 300 (and 64-bit places and
    counts 48: the bytes a snapshot unpacks, sums and decodes at a gateway's start);
    restored as the bytes they were written."""

    site: str
    chunk: int  # the proxy numbers of [chunk * CHUNK, (chunk + 1) * CHUNK)
    nos: UInt16s = msgspec.field(default_factory=UInt16s)  # number - chunk * CHUNK, ascending
    through_at: Int64s = msgspec.field(default_factory=Int64s)
    blocked_at: Int64s = msgspec.field(default_factory=Int64s)
    through: UInt32s = msgspec.field(default_factory=UInt32s)
    blocked: UInt32s = msgspec.field(default_factory=UInt32s)
    vantages: UInt16s = msgspec.field(default_factory=UInt16s)
    agents: list[str] = msgspec.field(default_factory=list)
    # Its cells whose latest steering word is through, turned away (/metrics), and the
    # log time of the latest steering word folded in (a reader of what moved since a
    # time passes over the rows heard from before it).
    latest_through: int = 0
    latest_blocked: int = 0
    last_at: int = 0

    def __post_init__(self) -> None:
        # Columns of unequal length are no row of this build's: 64-bit places and
        # counts (an earlier build's) read as more 16- and 32-bit ones than there are
        # times. Refused here, a store or snapshot of them is replayed instead.
        n = len(self.nos)
        if not (
            len(self.through_at) == len(self.blocked_at) == len(self.through) == n
            and len(self.blocked) == n
            and len(self.vantages) == n * MAX_VANTAGES
        ):
            raise ValueError("the columns of a row of site cells differ in length")


class ProxyQuality(msgspec.Struct, gc=False):
    """What the checks of one proxy say of it over time (reducers/quality.py): per
    log-time day from ``day0``, the milliseconds it was up and those that were known
    (between two checks not too far apart: up while both said so, down while both did,
    half and half when they differ); when its latest unbroken run of successes began;
    its latest download speed and the agent that measured it (a figure of that vantage)."""

    ip: str
    port: int
    checks: int = 0  # counted: by agents trusted then
    last_at: int = 0  # log time of the latest check counted
    last_ok: bool = False
    up_since: int = 0  # start of its unbroken run of successes; 0: the latest check failed
    day0: int = 0  # the day (log ms // DAY_MS) of the first of ``up`` and ``known``
    up: UInt32s = msgspec.field(default_factory=UInt32s)
    known: UInt32s = msgspec.field(default_factory=UInt32s)
    speed_kb_s: int = 0
    speed_at: int = 0
    speed_by: str = ""


class SiteProxy(msgspec.Struct, gc=False):
    """A proxy with cells, and the number its cells name it by (reducers/sites.py):
    given in the log's order, never given again."""

    ip: str
    port: int
    no: int


class Checkout(msgspec.Struct, array_like=True):
    """One checkout's claims (reducers/ledger.py), kept 48 h of log time."""

    first_at: int  # log time of its first claim
    consumer: str
    leases: list[str]
    targets: list[str]


class Take(msgspec.Struct, array_like=True):
    """A consumer's failed reports that took proxies out of alive (reducers/reports.py)."""

    hour: int  # the hour of log time being counted
    taken: int
    cap: int


class TrustBase(msgspec.Struct, array_like=True):
    """Checks of proxies the operator's agents had just confirmed, and how many failed
    (reducers/trust.py): the baseline the spot-checks are measured against."""

    checks: int = 0
    failed: int = 0
