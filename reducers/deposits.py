"""Deposits: what the log announced (``Deposited``) and what the fold made of it.

A seed batch is believed only from the agent holding its range's live lease, and only
when it starts where the range's resume cursor stands: a batch from a lost lease, or
one that would cover items again, is refused (counted on the agent) and moves nothing,
so every item of a range is settled by exactly one batch. Content keys (``page/``,
``input/``) name their own digest (events/validate.py), so anyone may announce one.

The ingest (projections/ingest.py) reads each pending deposit by key and records the
outcome in the log: ``DepositFolded``, or ``DepositRejected`` with the attempt number.
Attempts are counted from the log, so a restart of the fold cannot reset the budget;
at ``ATTEMPTS`` the deposit is poisoned. Announcing a content key again (a page fetched
again, after junk was stored under its key) gives it a new budget.
"""

from __future__ import annotations

from events.catalogue import Deposited, DepositFolded, DepositRejected
from events.keys import parse_key, range_target
from reducers import ledger
from reducers.state import DepositRow, State

__all__ = ["ATTEMPTS", "deposited", "folded", "rejected"]

ATTEMPTS = 5  # reads of a missing or malformed deposit before it is poisoned


def deposited(state: State, event: Deposited, seq: int, ts: int) -> str:
    """Record an announced deposit; returns why it was refused ("" when it was not)."""
    parts = parse_key(event.key)
    if parts is None:
        return "not a deposit key"
    held = bool(event.lease) and ledger.touch(state, event.lease, event.agent, ts)
    target = ""
    if parts.form == "seed":
        target = range_target(parts.plan, parts.range)
        rng = state.leases.get(target)
        if not held or rng is None or state.lease_owner.get(event.lease) != target:
            return "not the depositor's range"
        if event.cursor is None or parts.cursor != rng.cursor or event.cursor <= rng.cursor:
            return f"does not start at the range's cursor {rng.cursor}"
        ledger.advance(state, rng, event.cursor)
    row = state.deposits.get(event.key)
    if row is not None and row.status == "folded" and row.sha256 == event.sha256:
        # Announced again (stored again): folded already, so nothing is read again, but
        # it is fresh: retention (projections/retention.py) counts its age from here.
        row.seq = seq
        row.at = ts
        state.dirty["deposits"].add(event.key)
        return ""
    if row is None:
        row = DepositRow(key=event.key, sha256=event.sha256)
        state.deposits[event.key] = row
    row.sha256 = event.sha256
    row.bytes = event.bytes
    row.items = event.items
    row.agent = event.agent
    row.lease = event.lease
    row.target = target
    row.start = parts.cursor
    row.next = event.cursor if event.cursor is not None else 0
    row.seq = seq
    row.at = ts
    row.status = "pending"
    row.tried = row.attempts
    row.reason = ""
    state.pending_deposits.add(event.key)
    state.dirty["deposits"].add(event.key)
    return ""


def folded(state: State, event: DepositFolded) -> None:
    row = state.deposits.get(event.key)
    if row is None or row.status != "pending":
        return
    row.status = "folded"
    row.reason = event.reason
    state.pending_deposits.discard(event.key)
    state.dirty["deposits"].add(event.key)


def rejected(state: State, event: DepositRejected) -> None:
    row = state.deposits.get(event.key)
    if row is None or row.status != "pending" or event.attempt <= row.attempts:
        return  # one record per attempt: a repeated one counts once
    row.attempts = event.attempt
    row.reason = event.reason
    if row.attempts - row.tried >= ATTEMPTS:
        row.status = "poisoned"
        state.pending_deposits.discard(event.key)
    state.dirty["deposits"].add(event.key)
