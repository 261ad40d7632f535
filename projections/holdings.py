"""What agents hold of the lease ledger now: a read model for the grants (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from events import LeaseKind
from reducers import State
from reducers.pool import lease_live

__all__ = ["UNTESTED_EACH", "UNTESTED_SHARE", "live_holdings", "untested_room"]


def live_holdings(state: State, agent: str, now: int) -> int:
    """Leases ``agent`` holds that have not expired by ``now``."""
    held = state.holders.get(agent, ())
    return sum(1 for t in held if lease_live(state.leases[t], now))


# Agents not trusted (yet) hold, of each kind of lease, together at most this share of
# its targets, and each at most UNTESTED_EACH: however many of them heartbeat what they
# hold, the operator's agents keep the rest (trust off: no agent is told apart).
UNTESTED_SHARE = 0.5
UNTESTED_EACH = 16


def untested_room(
    state: State,
    agent: str,
    kind: LeaseKind,
    targets: int,
    now: int,
    unfolded: Sequence[str] = (),
) -> int:
    """How many more leases of ``kind`` (of ``targets`` in all) the untested ``agent``
    may take now; ``unfolded``: the untested holders of such leases granted and not in
    the ledger yet (a gateway answers a sure claim before its fold applies it: counted
    only once folded, ten agents asking in turn took 142 of a share of 128)."""
    untested = [a for a in state.holders if a not in state.trusted]
    mine, together = sum(a == agent for a in unfolded), len(unfolded)
    for holder in untested:
        for target in state.holders[holder]:
            row = state.leases[target]
            if row.kind == kind and lease_live(row, now):
                together += 1
                mine += holder == agent
    share = max(1, int(targets * UNTESTED_SHARE))
    return max(0, min(UNTESTED_EACH - mine, share - together))
