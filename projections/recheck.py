"""Which known proxies are due for a recheck, by shard: the checkers' work list.

Graduated intervals (a read model: pure, ``now`` passed in): a proxy that is failing
is rechecked soon, a new one (few confirmations) often, a long-lived one seldom.
Within a shard, proxies are interleaved across ASNs so one network's outage does not
fill a checker's whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from events import shard_of
from reducers import ProxyRow, State

__all__ = ["RecheckPolicy", "due_in_shard", "interval_s", "shards"]


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


def due_in_shard(
    rows: list[ProxyRow], now: int, limit: int, p: RecheckPolicy = RecheckPolicy()
) -> list[ProxyRow]:
    """Due proxies, most overdue first, interleaved across ASNs, at most ``limit``."""
    due = []
    for row in rows:
        last = max(row.last_seen, row.last_failed)
        overdue = now - last - interval_s(row, p) * 1000
        if overdue >= 0:
            due.append((overdue, row))
    due.sort(key=lambda pair: (-pair[0], pair[1].ip, pair[1].port))
    by_asn: dict[int, list[ProxyRow]] = {}
    for _, row in due:
        by_asn.setdefault(row.asn, []).append(row)
    out: list[ProxyRow] = []
    queues = list(by_asn.values())
    while queues and len(out) < limit:
        for q in queues:
            out.append(q.pop(0))
            if len(out) == limit:
                break
        queues = [q for q in queues if q]
    return out
