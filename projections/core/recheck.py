"""Which known proxies are due for a recheck, by shard: the checkers' work list.

Graduated intervals (a read model: pure, ``now`` passed in), settings in ``Configured``:
a proxy whose latest check failed is rechecked soon, and less often as the failures go
on (dead ones rarely; flapping ones no less often than fresh ones); a new one (few
confirmations) and a flapping one often; a long-lived stable one seldom.
Within a shard, proxies are interleaved across networks (AS organisation, else /16) so
one network's outage does not fill a checker's whole batch.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Container
from dataclasses import dataclass

from events import Settings, shard_of
from reducers import ProxyRow, State, trust
from reducers.state import ProxyKey

__all__ = [
    "RecheckPolicy",
    "due_in_shard",
    "flapping",
    "for_another_vantage",
    "has_due",
    "interval_s",
    "network",
    "network_outages",
    "shards",
    "spot_checks",
]


@dataclass(frozen=True, slots=True)
class RecheckPolicy:
    failing_s: int = 300  # a proxy whose last check failed
    fresh_s: int = 900  # fewer than ``fresh_confirmations`` confirmations, or flapping
    settled_s: int = 3_600
    veteran_s: int = 7_200  # alive for more than a day
    dead_s: int = 21_600  # the longest a failing proxy waits (failing_s doubles to it)
    fresh_confirmations: int = 3

    @classmethod
    def of(cls, s: Settings) -> RecheckPolicy:
        """The policy the log's settings give (``Configured``)."""
        return cls(
            failing_s=s.recheck_failing_s,
            fresh_s=s.recheck_fresh_s,
            settled_s=s.recheck_settled_s,
            veteran_s=s.recheck_veteran_s,
            dead_s=s.recheck_dead_s,
        )


_URGENT = 1 << 50  # overdue (ms) beyond any routine recheck's
_DAY_MS = 86_400_000


def interval_s(row: ProxyRow, p: RecheckPolicy = RecheckPolicy()) -> int:
    if row.fail_streak > 0:
        # Soon after a failure, then doubling: one that keeps failing is dead, mostly.
        # One that has come back before is likely to again: it is asked no less often
        # than a fresh one (its return is then seen within that, not hours later).
        longest = p.fresh_s if flapping(row) else p.dead_s
        return min(p.failing_s << min(row.fail_streak - 1, 20), max(longest, p.failing_s))
    if row.confirmations < p.fresh_confirmations or flapping(row):
        return p.fresh_s
    if row.last_seen - row.first_seen > _DAY_MS:
        return p.veteran_s
    return p.settled_s


def flapping(row: ProxyRow) -> bool:
    """Came back after failing at least twice, and about once a day of its life or more."""
    return row.flaps >= 2 and row.flaps * _DAY_MS >= row.last_seen - row.first_seen


def shards(state: State) -> dict[str, list[ProxyRow]]:
    """Every known proxy worth a check under its recheck shard (a stable hash of
    ip:port); not those only discredited agents reported (reducers/trust.py)."""
    out: dict[str, list[ProxyRow]] = {}
    trusting = state.settings.trust
    for row in state.proxies.values():
        if trusting and trust.hopeless(state, row):
            continue
        out.setdefault(shard_of(row.ip, row.port), []).append(row)
    return out


def spot_checks(state: State) -> set[ProxyKey]:
    """Unconfirmed proxies in the sample of spot-checks: checked at once, ahead of every
    routine recheck, so an untested agent's reports are tested while they are fresh and
    the agent earns trust (or loses it) within minutes. The rest of what it reported
    waits for its turn (or for the agent's trust)."""
    if not state.settings.trust:
        return set()
    vouched, share = trust.vouched(state), state.settings.spot_share
    return {
        key
        for key, row in state.proxies.items()
        if not vouched(row.agents) and trust.sampled(key, share) and not trust.hopeless(state, row)
    }


def network(row: ProxyRow) -> str:
    """What "the same network" means for spreading rechecks: the AS number or, as the
    offline data gives it, the AS organisation when known, else the /16 the address is
    in (an IPv6 address: the /32, what a registry hands one provider). Without this, a
    shard from one big hosting range would be rechecked all at once, and a range-wide
    outage would read as hundreds of dead proxies."""
    if row.asn:
        return f"as{row.asn}"
    if row.as_org:
        return f"org:{row.as_org}"
    if ":" in row.ip:
        return f"net6:{ipaddress.IPv6Address(row.ip).exploded[:9]}"
    a, b, *_ = row.ip.split(".")
    return f"net:{a}.{b}"


def due_in_shard(
    rows: list[ProxyRow],
    now: int,
    limit: int,
    p: RecheckPolicy = RecheckPolicy(),
    urgent: Container[ProxyKey] = (),
) -> list[ProxyRow]:
    """Due proxies, most overdue first, interleaved across networks, at most ``limit``;
    first of all those a consumer reported failed since their last check, and the
    ``urgent`` ones (spot-checks not taken yet)."""
    due = []
    for row in rows:
        overdue = _overdue(row, now, p, urgent)
        if overdue is not None:
            due.append((overdue, row))
    due.sort(key=lambda pair: (-pair[0], pair[1].ip, pair[1].port))
    by_network: dict[str, deque[ProxyRow]] = {}
    for _, row in due:
        by_network.setdefault(network(row), deque()).append(row)
    out: list[ProxyRow] = []
    queues = list(by_network.values())
    while queues and len(out) < limit:
        for q in queues:
            out.append(q.popleft())
            if len(out) == limit:
                break
        queues = [q for q in queues if q]
    return out


def has_due(
    rows: list[ProxyRow],
    now: int,
    p: RecheckPolicy = RecheckPolicy(),
    urgent: Container[ProxyKey] = (),
) -> bool:
    """Whether ``due_in_shard`` would give at least one row: the same rule, stopping at
    the first due row (a recheck lease asks it of every shard; at a million proxies a
    full ``due_in_shard`` for each held the gateway's loop for seconds)."""
    return any(_overdue(row, now, p, urgent) is not None for row in rows)


def _overdue(row: ProxyRow, now: int, p: RecheckPolicy, urgent: Container[ProxyKey]) -> int | None:
    """How overdue ``row`` is (ms; the urgent ahead of every routine one), None when not
    due: first those a consumer reported failed since their last check, then the
    ``urgent`` ones (spot-checks not taken yet), then by interval."""
    last = max(row.last_seen, row.last_failed)
    if row.reported_at > last:  # a consumer says it failed, and no check since
        return _URGENT + now - row.reported_at
    if urgent and row.last_failed < row.last_seen and (row.ip, row.port) in urgent:
        return _URGENT + now - last
    overdue = now - last - interval_s(row, p) * 1000
    return overdue if overdue >= 0 else None


def network_outages(
    state: State, now: int, *, window_s: int = 900, min_failing: int = 5, share: float = 0.5
) -> list[dict[str, object]]:
    """Networks (as ``network`` groups them) where at least ``min_failing`` proxies and
    ``share`` of those known failed their latest check within ``window_s``: a mass death
    the checkers' own connectivity does not explain (they void a cycle when it does), so
    it is applied, and shown as an outage of that network rather than as many deaths.
    ``vantages``: the agents whose checks saw them fail; ``confirmed`` once two did (until
    then, ``for_another_vantage`` leaves their next checks to another checker). Most
    failing first."""
    since = now - window_s * 1000
    known: dict[str, int] = {}
    failing: dict[str, int] = {}
    seen_by: dict[str, set[str]] = {}
    for row in state.proxies.values():
        net = network(row)
        known[net] = known.get(net, 0) + 1
        if row.fail_streak > 0 and row.last_failed >= since:
            failing[net] = failing.get(net, 0) + 1
            seen_by.setdefault(net, set()).update(row.failed_by)
    flagged = sorted(
        (-n, net) for net, n in failing.items() if n >= min_failing and n >= share * known[net]
    )
    return [
        {
            "network": net,
            "failing": -n,
            "known": known[net],
            "vantages": sorted(seen_by[net]),
            "confirmed": len(seen_by[net]) >= 2,
        }
        for n, net in flagged
    ]


def for_another_vantage(row: ProxyRow, agent: str, unconfirmed: Container[str]) -> bool:
    """Whether ``agent`` should leave this proxy's next check to another checker: it
    failed only ``agent``'s checks, in a network whose outage no second vantage has
    confirmed (our own way there may be what failed: a route, a filter on our exit)."""
    return row.fail_streak > 0 and row.failed_by == (agent,) and network(row) in unconfirmed
