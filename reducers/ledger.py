"""The lease ledger: which agent holds which target, decided by log order alone.

Rules (docs/architecture.md §4 and §7): the first valid claim on a target with no live lease wins;
events naming the live lease extend it; a release frees it; expiry and failed or
abandoned releases count attempts; at the attempt budget the target is failed until
a LeaseReset. Expiry is applied lazily, when the next message touches the target, at
that message's timestamp, so every replica and replay sees it at the same point.
"""

from __future__ import annotations

from events.catalogue import Heartbeat, Leased, LeaseReset, Released, SeedPlanned, Settings
from reducers.rows import Checkout
from reducers.state import LeaseRow, State

__all__ = [
    "advance",
    "claim",
    "clamped_ttl",
    "heartbeat",
    "on_subject",
    "plan",
    "release",
    "reset",
    "sure_claim",
    "touch",
]


def _row(state: State, target: str, kind: str) -> LeaseRow:
    row = state.leases.get(target)
    if row is None:
        row = LeaseRow(target=target, kind=kind)
        state.leases[target] = row
    return row


def _count_attempt(state: State, row: LeaseRow) -> None:
    if row.kind == "proxy":
        return  # a checkout ends as its consumer likes: no attempts, never failed
    row.attempts += 1
    if row.attempts >= state.settings.attempt_budget:
        row.status = "failed"


def _end(state: State, row: LeaseRow) -> None:
    state.lease_owner.pop(row.lease, None)
    state.checked_out.discard(row.target)
    held = state.holders.get(row.holder)
    if held is not None:
        held.discard(row.target)
    row.status = "free"
    row.holder = ""


def _expire(state: State, row: LeaseRow, ts: int) -> None:
    if row.status == "leased" and ts > row.expires_at:
        _end(state, row)
        row.last_error = "expired"
        _count_attempt(state, row)
        state.dirty["leases"].add(row.target)


def _live(state: State, lease: str, ts: int) -> LeaseRow | None:
    """The row whose live lease is ``lease`` at ``ts``, or None."""
    target = state.lease_owner.get(lease)
    if target is None:
        return None
    row = state.leases[target]
    _expire(state, row, ts)
    return row if row.status == "leased" and row.lease == lease else None


def on_subject(state: State, target: str, kind: str, seq: int) -> LeaseRow:
    """Every message on a lease subject, granted, lost or late, moves its sequence."""
    row = _row(state, target, kind)
    row.subject_seq = seq
    state.dirty["leases"].add(target)
    return row


def claim(state: State, event: Leased, seq: int, ts: int) -> bool:
    """Arbitrate a claim in log order; True when granted."""
    row = on_subject(state, event.target, event.kind, seq)
    _expire(state, row, ts)
    if row.status != "free":
        row.lost += 1
        return False
    ttl_s = clamped_ttl(state.settings, event.ttl_s)
    row.status = "leased"
    row.kind = event.kind
    row.holder = event.agent
    row.lease = event.lease
    row.epoch = seq
    row.leased_at = ts
    row.ttl_s = ttl_s
    row.expires_at = ts + ttl_s * 1000
    state.lease_owner[event.lease] = row.target
    state.holders.setdefault(event.agent, set()).add(row.target)
    if event.kind == "proxy":
        state.checked_out.add(row.target)
        if event.checkout:
            _checked_out(state, event, ts)
    return True


CHECKOUT_KEEP_MS = 48 * 3_600_000  # a checkout's id answers the same for this long


def _checked_out(state: State, event: Leased, ts: int) -> None:
    """Remember a granted claim under its checkout; forget checkouts past their keep."""
    entry = state.checkouts.get(event.checkout)
    if entry is None:
        if len(state.checkouts) % 64 == 0:  # now and then, in log time: deterministic
            horizon = ts - CHECKOUT_KEEP_MS
            for cid in [c for c, e in state.checkouts.items() if e.first_at < horizon]:
                del state.checkouts[cid]
        entry = state.checkouts[event.checkout] = Checkout(ts, event.agent, [], [])
    if entry.consumer == event.agent:
        entry.leases.append(event.lease)
        entry.targets.append(event.target)
    state.settings_dirty = True  # meta holds it


def clamped_ttl(settings: Settings, ttl_s: int) -> int:
    """The TTL a claim gets: what it asked for, within the settings' bounds."""
    return min(max(ttl_s, settings.lease_ttl_min_s), settings.lease_ttl_max_s)


def sure_claim(row: LeaseRow | None) -> bool:
    """Whether a claim on this target stored right after the row's ``subject_seq`` (a
    compare-and-set publish) is granted, however much of the log is still to be folded
    before it: ``claim`` grants a free row, and only messages on the target's own lease
    subject change a free row. A leased row, expired by the projection's clock, may
    have been extended by a heartbeat or a report not folded yet: only the fold can
    say."""
    return row is None or row.status == "free"


def touch(state: State, lease: str, agent: str, ts: int) -> bool:
    """An event naming a lease its holder still holds extends it; False when lost.
    ``_live`` written out: every report of a leased fetch lands here."""
    target = state.lease_owner.get(lease)
    if target is None:
        return False
    row = state.leases[target]
    if row.status == "leased" and ts > row.expires_at:
        _expire(state, row, ts)
    if row.status != "leased" or row.lease != lease or row.holder != agent:
        return False
    row.expires_at = ts + row.ttl_s * 1000
    state.dirty["leases"].add(row.target)
    return True


def heartbeat(state: State, event: Heartbeat, ts: int) -> int:
    """Extend every lease named; returns how many were no longer held."""
    return sum(not touch(state, lease, event.agent, ts) for lease in event.leases)


def release(state: State, event: Released, ts: int) -> bool:
    row = _live(state, event.lease, ts)
    if row is None or row.holder != event.agent:
        return False
    _end(state, row)
    row.last_error = event.error
    if event.outcome == "done":
        row.attempts = 0
    elif event.counted:
        _count_attempt(state, row)
    state.dirty["leases"].add(row.target)
    return True


def reset(state: State, event: LeaseReset) -> None:
    row = _row(state, event.target, event.kind)
    _end(state, row)
    row.attempts = 0
    row.last_error = ""
    state.dirty["leases"].add(row.target)


def plan(state: State, event: SeedPlanned) -> None:
    """Create one seed target per planned range, its cursor at the range's start; a
    range planned before keeps its cursor, and takes the plan's priority now."""
    for name, start, end in event.ranges:
        target = f"{event.plan}-{name}"
        row = state.leases.get(target)
        if row is None:
            row = _row(state, target, "seed")
            row.cursor = start
            row.start = start
        row.end = end
        row.priority = event.priority
        row.input = event.input
        row.input_kind = event.kind
        state.dirty["leases"].add(target)


def advance(state: State, row: LeaseRow, cursor: int) -> None:
    """A seed range's resume cursor: ``max(cursor, min(deposited, end + 1))``."""
    row.cursor = max(row.cursor, min(cursor, row.end + 1))
    state.dirty["leases"].add(row.target)
