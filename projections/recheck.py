"""Which known proxies are due for a recheck, by shard: the checkers' work list.

Graduated intervals (a read model: pure, ``now`` passed in): a proxy that is failing
is rechecked soon, a new one (few confirmations) often, a long-lived one seldom.
Within a shard, proxies are interleaved across networks (AS organisation, else /16) so
one network's outage does not fill a checker's whole batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from events import shard_of
from reducers import ProxyRow, State

__all__ = ["RecheckPolicy", "due_in_shard", "interval_s", "network", "shards"]


@dataclass(frozen=True, slots=True)
class RecheckPolicy:
    failing_s: int = 300  # a proxy whose last check failed
    fresh_s: int = 900  # fewer than ``fresh_confirmations`` confirmations
    settled_s: int = 3_600
    veteran_s: int = 7_200  # alive for more than a day
    fresh_confirmations: int = 3


def interval_s(row: ProxyRow, p: RecheckPolicy = RecheckPolicy()) -> int:
    if row.fail_streak > 0:
        return p.failing_s
    if row.confirmations < p.fresh_confirmations:
        return p.fresh_s
    if row.last_seen - row.first_seen > 86_400_000:
        return p.veteran_s
    return p.settled_s


def shards(state: State) -> dict[str, list[ProxyRow]]:
    """Every known proxy under its recheck shard (a stable hash of ip:port)."""
    out: dict[str, list[ProxyRow]] = {}
    for row in state.proxies.values():
        out.setdefault(shard_of(row.ip, row.port), []).append(row)
    return out


def network(row: ProxyRow) -> str:
    """What "the same network" means for spreading rechecks: the AS number or, as the
    offline data gives it, the AS organisation when known, else the /16 the address is
    in. Without this, a shard from one big hosting range would be rechecked all at once,
    and a range-wide outage would read as hundreds of dead proxies."""
    if row.asn:
        return f"as{row.asn}"
    if row.as_org:
        return f"org:{row.as_org}"
    a, b, *_ = row.ip.split(".")
    return f"net:{a}.{b}"


def due_in_shard(
    rows: list[ProxyRow], now: int, limit: int, p: RecheckPolicy = RecheckPolicy()
) -> list[ProxyRow]:
    """Due proxies, most overdue first, interleaved across networks, at most ``limit``."""
    due = []
    for row in rows:
        last = max(row.last_seen, row.last_failed)
        overdue = now - last - interval_s(row, p) * 1000
        if overdue >= 0:
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
