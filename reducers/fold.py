"""The one generic fold: apply a decoded event at (seq, ts) to every projection it touches.

``ts`` is the JetStream server timestamp of the message in unix ms. A sequence at or
below ``state.last_seq`` was applied already (a redelivery) and changes nothing.
"""

from __future__ import annotations

from typing import assert_never

from events.catalogue import (
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
    ProxyFailed,
    ProxyWorked,
    Released,
    SeedPlanned,
    SourceAdded,
)
from reducers import agents, ledger, proxies, sources
from reducers.state import State

__all__ = ["fold", "skip"]


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
    """Apply one event; False when ``seq`` was already applied."""
    if seq <= state.last_seq:
        return False
    _tick(state, ts)
    agent = agents.observe(state, event.agent, type(event).__name__, ts)
    match event:
        case ProxyWorked():
            known = (event.ip, event.port) in state.proxies
            if proxies.worked(state, event, ts) is None:
                agent.rejected += 1
            else:
                sources.credit(state, event, not known)
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case ProxyFailed():
            if not proxies.failed(state, event, ts):
                agent.rejected += 1
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case Leased():
            if not ledger.claim(state, event, seq, ts):
                agent.lost += 1
        case Heartbeat():
            agent.late += ledger.heartbeat(state, event, ts)
        case Released():
            if event.kind == "source":
                sources.settle(state, event.target, event.lease)
            if not ledger.release(state, event, ts):
                agent.late += 1
        case Fetched():
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
            if event.lease and not ledger.deposit(state, event, ts):
                agent.late += 1
        case LeaseReset():
            ledger.reset(state, event)
        case SeedPlanned():
            ledger.plan(state, event)
        case AgentEnrolled():
            agents.enrolled(state, event, ts)
        case Configured():
            state.settings = event.settings
            state.settings_dirty = True
        case DepositFolded() | DepositRejected():
            pass  # recorded per agent above; deposits get their own projection later
        case _:
            assert_never(event)
    state.last_seq = seq
    return True
