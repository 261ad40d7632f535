"""The state's derived pieces, rebuilt from what is kept after a restore."""

from __future__ import annotations

from reducers import geo, pool, sites, trust
from reducers.pool import Composition
from reducers.state import State

__all__ = ["reindex"]


def reindex(state: State, counted: tuple[Composition, Composition] | None = None) -> None:
    """Rebuild the derived pieces of ``state``; ``counted``: the composition and its
    failing part when the caller has counted them already (``pool.counted``)."""
    state.lease_owner = {}
    state.holders = {}
    state.checked_out = set()
    for row in state.leases.values():
        if row.status == "leased" and row.lease:
            state.lease_owner[row.lease] = row.target
            state.holders.setdefault(row.holder, set()).add(row.target)
            if row.kind == "proxy":
                state.checked_out.add(row.target)
    state.tokens = {a.token_sha256: a.name for a in state.agents.values() if a.token_sha256}
    state.pending_deposits = {k for k, d in state.deposits.items() if d.status == "pending"}
    trust.reindex(state)
    state.doubts = {}
    for key, names in state.doubted.items():
        for name in names:
            state.doubts.setdefault(name, set()).add(key)
    state.composition, state.failing = counted or pool.counted(state.proxies.values())
    state.by_ip = {}
    state.unlocated = set()
    for proxy in state.proxies.values():
        geo.admitted(state, proxy)
    sites.reindex(state)
