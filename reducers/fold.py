"""The one generic fold: apply a decoded event at (seq, ts) to every projection it touches.

``ts`` is the JetStream server timestamp of the message in unix ms. A sequence at or
below ``state.last_seq`` was applied already (a redelivery) and changes nothing.
"""

from __future__ import annotations

from typing import assert_never

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
    SourceAdded,
)
from events.keys import DERIVED_PREFIX
from reducers import agents, deposits, geo, ledger, proxies, sources, trust
from reducers.state import State

__all__ = ["fold", "skip"]

_OBSERVED = frozenset(OBSERVATIONS)


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
