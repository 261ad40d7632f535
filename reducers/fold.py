"""The one generic fold: apply a decoded event at (seq, ts) to every projection it touches.

``ts`` is the JetStream server timestamp of the message in unix ms. A sequence at or
below ``state.last_seq`` was applied already (a redelivery) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

from events.address import LAB_V4_MASKS, NOT_PUBLIC_V4_MASKS
from events.catalogue import (
    OBSERVATIONS,
    AgentEnrolled,
    AnyEvent,
    Configured,
    Deposited,
    DepositFolded,
    DepositRejected,
    Discovered,
    Extracted,
    Fetched,
    Heartbeat,
    Leased,
    LeaseReset,
    Located,
    ProxyFailed,
    ProxyReported,
    ProxyWorked,
    Released,
    SeedPlanned,
    Settings,
    SourceAdded,
)
from events.keys import DERIVED_PREFIX
from reducers import agents, deposits, geo, ledger, proxies, sources, trust
from reducers.pool import BUCKET_MS, Composition
from reducers.state import AgentRow, LeaseRow, ProxyRow, SourceRow, State

__all__ = ["FAST", "fast_batch", "fast_folds", "fold", "fold_rules", "native_fastfold", "skip"]

_OBSERVED = frozenset(OBSERVATIONS)

# The fold's everyday events, a proxy confirmed (most of the log), a failed recheck and a
# location (one per address), are folded by reducers/_fastfold.c in one call each (in
# Python the first was more than half of the fold's time); it answers False, having
# changed nothing, for anything but those everyday cases, and fold_rules() applies them.
FastFold = Callable[[State, Any, int, int], bool]
FAST: dict[type, FastFold] = {}
FoldBatch = Callable[..., tuple[int, int, int]]
_fold_batch: FoldBatch | None = None
try:
    from reducers import _fastfold  # type: ignore[attr-defined, unused-ignore]

    _fastfold.configure(
        {
            "failed": ProxyFailed,
            "located": Located,
            "worked": ProxyWorked,
            "state": State,
            "settings": Settings,
            "agent": AgentRow,
            "proxy": ProxyRow,
            "source": SourceRow,
            "lease": LeaseRow,
            "composition": Composition,
            "places": geo.PLACES,
            "blocked": NOT_PUBLIC_V4_MASKS,
            "lab_ranges": LAB_V4_MASKS,
            "shared": proxies.SHARED,
            "derived": DERIVED_PREFIX,
            "tag": ProxyWorked.__name__,
            "tag_failed": ProxyFailed.__name__,
            "leased": "leased",
            "sweep_ms": proxies.SWEEP_MS,
            "bucket_ms": BUCKET_MS,
        }
    )
    FAST = {
        ProxyWorked: _fastfold.reconfirm,
        ProxyFailed: _fastfold.refail,
        Located: _fastfold.locate,
    }
    _fold_batch = _fastfold.fold_batch
except ImportError:  # no C compiler at install time: fold_rules() does it all, slower
    pass


def native_fastfold() -> bool:
    """Whether reducers/_fastfold.c was built here (``ppf bench fold`` reports it)."""
    return bool(FAST)


def fast_folds() -> dict[type, FastFold]:
    """The C folds by event type, as they are now (empty without the C): Folder.apply asks
    them first and calls fold_rules only where they decline, one Python call an event."""
    return FAST


def fast_batch() -> FoldBatch | None:
    """Folder.apply's loop in C (None without the C, or with FAST emptied, as the tests
    do to fold in Python alone): it folds a batch's plain messages and hands back, one at
    a time, those Folder must take itself."""
    return _fold_batch if FAST else None


def skip(state: State, seq: int, ts: int) -> None:
    """Advance past a message that is not an event (a DLQ entry, an undecodable payload)."""
    if seq > state.last_seq:
        _tick(state, ts)
        state.last_seq = seq


def _tick(state: State, ts: int) -> None:
    bucket = ts // proxies.SWEEP_MS
    if bucket > state.sweep_bucket:
        if state.sweep_bucket:
            proxies.sweep(state, ts)
        state.sweep_bucket = bucket
        state.settings_dirty = True


def fold(state: State, event: AnyEvent, seq: int, ts: int) -> bool:
    """Apply one event; False when ``seq`` was already applied, or the event is an
    agent's re-send of one already folded (``seq`` is then passed, nothing changes)."""
    fast = FAST.get(type(event))
    if fast is not None and fast(state, event, seq, ts):
        return True
    return fold_rules(state, event, seq, ts)


def fold_rules(state: State, event: AnyEvent, seq: int, ts: int) -> bool:
    """fold() without asking the C first: the rules as written, which the C follows."""
    if seq <= state.last_seq:
        return False
    if ts >= state.sweep_bucket * proxies.SWEEP_MS + proxies.SWEEP_MS:
        _tick(state, ts)
    # Per-agent activity, inlined: it runs for every event. Below, the type is looked up
    # in a set (no event type has subclasses; a tuple isinstance costs more on this, the
    # fold's hottest path).
    if isinstance(event, Located):
        # The service's record of a lookup, not an agent's doing, and one message in ten
        # while the pool grows: it skips the per-agent accounting below (the issue's
        # bar: Located adds < 5 % to the fold).
        geo.located(state, event)
        state.last_seq = seq
        return True
    settings = state.settings
    kind = type(event)
    observed = kind in _OBSERVED
    if observed and settings.agent_subjects:
        # An agent's observations arrive in the order of their ids (its client stamps
        # them as it sends, and its outbox re-sends in order), so one at or below the
        # highest already folded is a re-send: ignored whatever the time since, where
        # the stream's duplicate window forgets after minutes. Ids are the agent's own:
        # each agent has its own mark, so nobody else's ids can shadow its events.
        # Events the fold derived from a deposit (events/keys.py) carry the depositing
        # agent but not its numbering, and are kept once by their fixed ids instead.
        high_water = state.high_water
        name = event.agent
        eid = event.id
        if eid[:4] != DERIVED_PREFIX:
            if eid <= high_water.get(name, ""):
                state.last_seq = seq
                return False
            high_water[name] = eid
    agent = state.agents.get(event.agent) or agents.row(state, event.agent)
    if ts > agent.last_seen:
        agent.last_seen = ts
    if observed and settings.trust and agent.name not in state.operators:
        trust.count(state, agent, event, ts)  # the operator's agents have no quotas
    counts = agent.counts
    tag = kind.__name__
    counts[tag] = counts.get(tag, 0) + 1
    match event:
        case ProxyWorked():
            src = state.sources.get(event.source) if event.source else None
            source = src.url_id if src is not None else event.source
            new = proxies.worked(state, event, ts, agent.name, source)
            if new is None:
                agent.rejected += 1
            elif src is not None:
                sources.credit(state, src, event, new)
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case ProxyFailed():
            if not proxies.failed(state, event, ts, agent.name):
                agent.rejected += 1
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case Leased():
            if not ledger.claim(state, event, seq, ts):
                agent.lost += 1
        case Heartbeat():
            agent.late += ledger.heartbeat(state, event, ts)
            if event.outage != agent.outage:
                agent.outage_since = ts if event.outage else 0
                agent.outage = event.outage
        case Released():
            ledger.on_subject(state, event.target, event.kind, seq)
            if event.kind == "source" and event.lease:  # "" would settle any lease's fetch
                sources.settle(state, event.target, event.lease)
            if not ledger.release(state, event, ts):
                agent.late += 1
        case Fetched():
            if not event.ok:  # per-agent error counts feed the fleet's error rate
                counts["Fetched.failed"] = counts.get("Fetched.failed", 0) + 1
            sources.fetched(state, event, ts)
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case Extracted():
            sources.extracted(state, event)
        case SourceAdded():
            sources.add(state, event, ts)
        case Discovered():
            sources.discover(state, event, ts)
        case Deposited():
            if deposits.deposited(state, event, seq, ts):
                agent.rejected += 1
        case LeaseReset():
            ledger.on_subject(state, event.target, event.kind, seq)
            ledger.reset(state, event)
        case SeedPlanned():
            ledger.plan(state, event)
        case AgentEnrolled():
            agents.enrolled(state, event, ts)
            if state.settings.trust:  # a revoked agent vouches for nothing more
                trust.reindex(state)
        case Configured():
            lab_ends = state.settings.lab and not event.settings.lab
            state.settings = event.settings
            state.settings_dirty = True
            trust.reindex(state)
            if lab_ends:
                proxies.purge_lab(state)
        case ProxyReported():
            if not proxies.reported(state, event, ts, agent):
                agent.rejected += 1  # unknown, not failed, suspect already, or over budget
        case DepositFolded():
            deposits.folded(state, event)
        case DepositRejected():
            deposits.rejected(state, event)
        case _:
            assert_never(event)
    state.last_seq = seq
    return True
