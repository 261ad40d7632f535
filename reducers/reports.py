"""Consumers' failed reports once ``guarded``: each within what one token may do.

A consumer's ``ProxyReported(failed)`` is the word of whoever holds a consumer token,
and tokens are handed out freely. So a report acts on three levels:

- **for the reporter**: the proxy is not served to that consumer again (on every
  authenticated read: ``/v1/proxies``, the rotating endpoint) until a check by an agent
  trusted now brings it back (``doubted``, cleared by ``cleared``);
- **for the checkers**: it goes first in their queue (``reported_at``);
- **for everyone**: it leaves ``alive`` (suspect, as after a failed check) when the
  reporter is one the operator trusts (``ppf token trust``), or while an untrusted
  reporter's takes this hour stay within ``report_share`` of the served pool as it was
  at the first take of that hour (``takes``). One token cannot empty
  a pool of 50 (2 %: one proxy an hour) nor of 5,000 (100 an hour).

A report without a token (``ANONYMOUS``: the drop-in ``/delete/`` that tools call
bare) only moves the proxy up the queue; the gateway budgets those per address. Every
consumer's failed reports count against ``report_budget_per_hour`` (429 past it), which
also bounds what ``doubted`` holds. Pure, deterministic: log time only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from events.catalogue import ProxiesChecked, ProxyReported
from reducers import trust
from reducers.pool import band_edges, fresh_status
from reducers.rows import Take
from reducers.state import AgentRow, ProxyKey, ProxyRow, State

__all__ = ["ANONYMOUS", "cleared", "hidden_from", "reported", "served_now", "traffic"]

ANONYMOUS = "~anonymous"  # a name no agent can have (events/subjects.py)
HOUR_MS = 3_600_000
_MAX_REPORTERS = 32  # consumers remembered per doubted proxy; past it, it is failing anyway


def reported(state: State, event: ProxyReported, ts: int, consumer: AgentRow) -> bool:
    """Fold one failed report; False when it changes nothing (not failed, unknown
    proxy, over the consumer's hourly budget)."""
    key: ProxyKey = (event.ip, event.port)
    row = state.proxies.get(key)
    if row is None or event.outcome != "failed":
        return False
    name = consumer.name
    if name != ANONYMOUS:
        hour = ts // HOUR_MS
        if consumer.report_hour != hour:
            consumer.report_hour, consumer.reports_acted = hour, 0
        operator = name in state.operators
        if not operator and consumer.reports_acted >= state.settings.report_budget_per_hour:
            return False
        consumer.reports_acted += 1
        _doubt(state, key, name)
        if _served(state, row, ts) and (operator or _take(state, name, hour, ts)):
            state.failing.add(row)
            row.fail_streak = 1
    row.reported_at = ts
    state.dirty["proxies"].add(key)
    return True


def traffic(
    state: State,
    consumer: AgentRow,
    batch: ProxiesChecked,
    ts: int,
    skip: Collection[int] = (),
) -> None:
    """A consumer's traffic through the rotating endpoint, one round of outcomes: each
    failure is the consumer's failed report (within its budget, as above; past it, or on
    a proxy gone from the pool, counted in its ``rejected``), each success only counted.
    Traffic is the consumer's word: it never confirms a proxy, nor revives one."""
    if ts > consumer.last_seen:
        consumer.last_seen = ts
    counts = consumer.counts
    for j, r in enumerate(batch.results):
        if j in skip:  # refused to the DLQ already (its facts)
            continue
        tag = "Traffic.worked" if r.ok else "Traffic.failed"
        counts[tag] = counts.get(tag, 0) + 1
        if r.ok:
            continue
        said = ProxyReported(
            id=batch.id, agent=consumer.name, at=batch.at, ip=r.ip, port=r.port, outcome="failed"
        )
        if not reported(state, said, ts, consumer):
            consumer.rejected += 1


def _doubt(state: State, key: ProxyKey, name: str) -> None:
    names = state.doubted.get(key, ())
    if name not in names and len(names) < _MAX_REPORTERS:
        state.doubted[key] = (*names, name)
        state.doubts.setdefault(name, set()).add(key)


def _take(state: State, name: str, hour: int, ts: int) -> bool:
    """Whether an untrusted consumer may take one more proxy out of alive this hour."""
    take = state.takes.get(name)
    if take is None or take.hour != hour:
        cap = int(state.settings.report_share * served_now(state, ts))
        take = state.takes[name] = Take(hour, 0, cap)
    if take.taken >= take.cap:
        return False
    take.taken += 1
    return True


def served_now(state: State, ts: int) -> int:
    """How many proxies ``/v1/proxies`` serves by default at log time ``ts``: alive,
    confirmed by an agent trusted now, not failing, not seen tampering."""
    served = _served_at(state, ts)  # the TTL's edge and who is trusted, once for all rows
    return sum(1 for r in state.proxies.values() if served(r))


def _served(state: State, row: ProxyRow, ts: int) -> bool:
    return _served_at(state, ts)(row)


def _served_at(state: State, ts: int) -> Callable[[ProxyRow], bool]:
    alive_from, _ = band_edges(ts, state.settings.proxy_ttl_s)
    vouched = trust.vouched(state)

    def served(row: ProxyRow) -> bool:
        if row.last_seen < alive_from:
            return False
        return fresh_status(row.fail_streak > 0, vouched(row.agents), row.mitm) == "alive"

    return served


def cleared(state: State, key: ProxyKey) -> None:
    """A trusted check found it working (or it left the pool): served to all again."""
    for name in state.doubted.pop(key, ()):
        keys = state.doubts.get(name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del state.doubts[name]


def hidden_from(state: State, consumer: str) -> set[ProxyKey]:
    """What a consumer's own failed reports keep from it."""
    return state.doubts.get(consumer, set())
