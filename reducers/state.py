"""The container the fold mutates: every piece of its state, declared once with its type
and how it is kept (reducers/kept.py). The rows are in reducers/rows.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from events.catalogue import LAST_FIRST_SETTING, Settings
from events.sites import SiteRule
from reducers.kept import NEVER, WHILE_ANY, Kept, Table, declared, derived, kept, replica, table
from reducers.marks import Mark, Recent
from reducers.pool import Composition
from reducers.rows import (
    MAX_SAMPLE_MS,
    AgentRow,
    Checkout,
    DepositRow,
    LeaseRow,
    ProxyKey,
    ProxyQuality,
    ProxyRow,
    SiteCells,
    SiteProxy,
    SourceRow,
    Take,
    TrustBase,
    latency_samples,
    unpack_samples,
)

__all__ = [
    "DIRTY",
    "KEPT",
    "MAX_SAMPLE_MS",
    "TABLES",
    "WHOLE",
    "AgentRow",
    "DepositRow",
    "LeaseRow",
    "ProxyKey",
    "ProxyRow",
    "SourceRow",
    "State",
    "latency_samples",
    "settings_part",
    "unpack_samples",
]

_FIELDS = Settings.__struct_fields__
_LATER = _FIELDS[_FIELDS.index(LAST_FIRST_SETTING) + 1 :]
_DEFAULTS = msgspec.structs.asdict(Settings())


def settings_part(settings: Settings) -> dict[str, Any]:
    """The settings as the meta digest hashes them: a setting added after the first logs
    is left out while at its default, so a log written before it keeps its digest."""
    out = msgspec.structs.asdict(settings)
    for name in _LATER:
        if out[name] == _DEFAULTS[name]:
            del out[name]
    return out


def _sorted_items(value: dict[Any, Any]) -> list[Any]:
    return sorted(value.items())


def _doubted_rows(doubted: dict[ProxyKey, tuple[str, ...]]) -> list[Any]:
    return [(ip, port, names) for (ip, port), names in doubted.items()]


def _doubted(rows: list[tuple[str, int, tuple[str, ...]]]) -> dict[ProxyKey, tuple[str, ...]]:
    return {(ip, port): names for ip, port, names in rows}


class State:
    """Everything the reducers fold into, with the keys changed since the last checkpoint
    (``dirty``, a set per table but those written whole)."""

    # The projections, in the digest's order.
    proxies: dict[ProxyKey, ProxyRow] = table(
        ProxyRow, "ip", "port", columns=("proto", "last_seen")
    )
    sources: dict[str, SourceRow] = table(SourceRow, "url_id", columns=("url", "check_time"))
    leases: dict[str, LeaseRow] = table(LeaseRow, "target", columns=("kind", "status"))
    agents: dict[str, AgentRow] = table(AgentRow, "name", whole=True)
    deposits: dict[str, DepositRow] = table(DepositRow, "key", columns=("status",))
    # Per proxy and site (reducers/sites.py), from the fleet's site verdicts: each site's
    # cells in rows of a run of proxy numbers, by (site, chunk); and the numbers.
    sites: dict[tuple[str, int], SiteCells] = table(
        SiteCells, "site", "chunk", digest=WHILE_ANY, packed=True
    )
    site_proxies: dict[ProxyKey, SiteProxy] = table(SiteProxy, "ip", "port", digest=WHILE_ANY)
    # Per proxy, what its checks say of it over time (reducers/quality.py), from the
    # quality setting.
    quality: dict[ProxyKey, ProxyQuality] = table(ProxyQuality, "ip", "port", digest=WHILE_ANY)

    # The meta, in the digest's order.
    last_seq: int = kept(int, digest=NEVER, position=True)
    settings: Settings = kept(Settings, canonical=settings_part)
    sweep_bucket: int = kept(int, position=True)
    # agent -> the highest event id of its observations folded so far: a re-send,
    # however late, is ignored (reducers/fold.py). Only logs with per-agent subjects.
    high_water: dict[str, str] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items)
    # From the resend_window setting, a window of each agent's newest ids instead
    # (reducers/marks.py).
    marks: dict[str, Mark] = kept(
        dict,
        digest=WHILE_ANY,
        canonical=lambda marks: sorted((a, m.floor, m.ids) for a, m in marks.items()),
    )
    # From the resend_window_s setting, a window of log time instead: each agent's ids
    # with the log time each is forgotten at (reducers/marks.py ``Recent``).
    recent: dict[str, Recent] = kept(
        dict,
        digest=WHILE_ANY,
        canonical=lambda recent: sorted((a, list(r.until.items())) for a, r in recent.items()),
    )
    # The baseline the operator's checks set (reducers/trust.py), from the trust setting.
    trust_base: TrustBase = kept(TrustBase, when="trust")
    # Consumers' failed reports once guarded (reducers/reports.py): proxy -> the
    # consumers it is kept from until a trusted check; consumer -> its takes this hour.
    doubted: dict[ProxyKey, tuple[str, ...]] = kept(
        dict,
        digest=WHILE_ANY,
        canonical=lambda doubted: sorted((list(k), list(v)) for k, v in doubted.items()),
        stored=(list[tuple[str, int, tuple[str, ...]]], _doubted_rows, _doubted),
    )
    takes: dict[str, Take] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items)
    # The operator's rules for reading sites' answers, by site (``ppf sites add``).
    site_rules: dict[str, SiteRule] = kept(
        dict, digest=WHILE_ANY, canonical=_sorted_items, later=True
    )
    # A consumer's blocked reports that acted, per site, this hour (reducers/sites.py),
    # keyed "<consumer> <site>".
    site_takes: dict[str, Take] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items, later=True)
    # Sites the consumers' traffic went to (an endpoint's verdicts), by the log time of the
    # latest: the fleet's probes follow them (projections/core/probes.py).
    site_traffic: dict[str, int] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items, later=True)
    # Checkouts (reducers/ledger.py, lease kind "proxy") by id, kept 48 h of log time.
    checkouts: dict[str, Checkout] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items)
    # The number the next proxy with cells is given (reducers/sites.py).
    next_site_no: int = kept(int, digest=WHILE_ANY, later=True)
    # The operator's URL of each target that has one (``SiteRuled.url``): where the
    # fleet's probes of the site ask (gateway/rechecks.py); the rules stay without it.
    site_urls: dict[str, str] = kept(dict, digest=WHILE_ANY, canonical=_sorted_items, later=True)

    # Derived from the above, rebuilt on restore (reducers/indexes.py).
    # Deposits announced and neither folded nor poisoned: what the deposit ingest reads
    # (never a listing of the bucket).
    pending_deposits: set[str] = derived(set)
    lease_owner: dict[str, str] = derived(dict)  # current lease id -> its target
    holders: dict[str, set[str]] = derived(dict)  # agent -> targets it holds (or did)
    tokens: dict[str, str] = derived(dict)  # token SHA-256 -> agent name
    checked_out: set[str] = derived(set)  # the proxy targets leased
    # The pool's composition by last_seen bucket (reducers/pool.py), kept by deltas; and
    # the same counts of the rows whose latest check failed (suspect while seen within
    # the TTL), so /v1/stats counts what /v1/proxies serves.
    composition: Composition = derived(Composition)
    failing: Composition = derived(Composition)
    # ip -> (its location or None, the ports of its rows) (reducers/geo.py), and the
    # addresses no Located has reached yet: what the service still has to look up.
    by_ip: dict[str, tuple[Any, tuple[int, ...]]] = derived(dict)
    unlocated: set[str] = derived(set)
    # Trust (reducers/trust.py): whose confirmations put a proxy in the served pool (the
    # operator's agents and those that earned it), whose checks are spot-checks (the
    # operator's); settings.trusted_agents as a set.
    trusted: frozenset[str] = derived(frozenset)
    judges: frozenset[str] = derived(frozenset)
    operators: frozenset[str] = derived(frozenset)
    doubts: dict[str, set[ProxyKey]] = derived(dict)  # ``doubted`` by consumer
    site_cells: dict[str, int] = derived(dict)  # site -> its cells (reducers/sites.py)
    site_seen: dict[str, int] = derived(dict)  # site -> its cells' latest verdict (log ms)
    site_proxy: dict[int, ProxyKey] = derived(dict)  # ``site_proxies`` by number
    # A source's fetch in progress -> (its lease, the addresses of its cur_working):
    # built when first needed, never rebuilt (reducers/sources.py _working_set).
    working_sets: dict[str, tuple[str, set[str]]] = derived(dict)

    # This replica's own. Re-sends met and ignored since it started, per agent (a
    # re-send changes no projection: its digest is the log's without it); for an agent
    # to learn what it does wrong (GET /v1/agents/me), its clock minus log time at its
    # latest observation (ms) and the latest reason the fold refused one of its events.
    resent: dict[str, int] = replica(dict)
    skew: dict[str, int] = replica(dict)
    refusals: dict[str, str] = replica(dict)
    # Per site, the answers folded this hour of log time: [hour, the probes', the traffic's]
    # (GET /v1/sites); at most twice MAX_SITES sites, each hour's anew.
    site_hour: dict[str, list[int]] = replica(dict)
    sites_unkept: int = replica(int)  # site verdicts not kept: an unknown proxy, a cap
    # Per table, the keys changed since the last checkpoint (a table written whole has
    # none): filled in by __init__ from ``TABLES``.
    dirty: dict[str, set[Any]] = replica(dict)
    settings_dirty: bool = replica(bool)
    # ``dirty["proxies"]`` has two readers, the checkpoint and the pool view that follows
    # this state (gateway/views.py), each taking the keys changed since it last took:
    # what one took and the other has not yet waits for it here (``view_changes`` is
    # None while no view follows).
    unwritten: set[ProxyKey] = replica(set)
    view_changes: set[ProxyKey] | None = replica(lambda: None)

    def __init__(self) -> None:
        for piece in PIECES:
            setattr(self, piece.name, piece.new())
        self.dirty = {name: set() for name in DIRTY}

    def mark_all_dirty(self) -> None:
        """Every row changed: the next checkpoint writes them all (a state loaded from a
        snapshot, into a fresh file)."""
        self.dirty = {name: set(getattr(self, name)) for name in DIRTY}
        self.settings_dirty = True

    def take_unwritten(self) -> set[ProxyKey]:
        """The proxy keys changed since the last checkpoint took them (its cut)."""
        dirty, self.dirty["proxies"] = self.dirty["proxies"], set()
        if self.view_changes is not None:
            self.view_changes |= dirty
        if self.unwritten:
            dirty |= self.unwritten
            self.unwritten = set()
        return dirty

    def take_view_changes(self) -> set[ProxyKey]:
        """The proxy keys changed since the pool view last took them; from the first
        call on, the checkpoint's cuts keep them for it."""
        dirty, self.dirty["proxies"] = self.dirty["proxies"], set()
        self.unwritten |= dirty
        changed = self.view_changes if self.view_changes is not None else set()
        changed |= dirty
        self.view_changes = set()
        return changed

    def take_dirty(self) -> dict[str, set[Any]]:
        """Every table's changed keys, taken (the proxies' as ``take_unwritten``)."""
        taken = {name: self.take_unwritten() if name == "proxies" else keys
                 for name, keys in self.dirty.items()}  # fmt: skip
        self.dirty = {name: set() for name in DIRTY}
        self.settings_dirty = False
        return taken


PIECES = declared(State)
# The projections, in the digest's order, by name.
TABLES: dict[str, Table] = {p.name: p for p in PIECES if isinstance(p, Table)}
# The tables with a dirty set, in the digest's order.
DIRTY: tuple[str, ...] = tuple(name for name, t in TABLES.items() if not t.whole)
WHOLE: tuple[str, ...] = tuple(name for name, t in TABLES.items() if t.whole)
# The meta in the digest's order; a checkpoint keeps the fold's position first.
KEPT: tuple[Kept, ...] = tuple(p for p in PIECES if isinstance(p, Kept))
