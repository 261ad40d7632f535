"""Workers earn trust: whose word puts a proxy in the served pool.

Names are cheap, so a report counts for what its reporter has shown. From the
``Configured`` that sets ``trust`` (before it every agent is believed, as logs written
before it always were):

- The operator's agents (``settings.trusted_agents``: ``ppf up``'s own, and those
  ``ppf token trust`` marks) are trusted; a revoked one is not.
- A proxy is served while an agent trusted *now* is among those that confirmed it: one
  of the operator's, or one that earned trust. A second untrusted agent adds nothing.
- A **spot-check** is a check by one of the operator's checkers (they report failures
  as well as successes; a worker reports only what worked, so its word could only ever
  clear) of a proxy none of the operator's agents has confirmed, at most
  ``spot_window_s`` after the latest report and the first check since it. It tests
  every other agent that reported the proxy: held when it worked, failed when not.
- The **baseline** is the same kind of check of proxies an operator's agent had just
  confirmed: the share that fails is what churn and vantage cost anybody, so they do
  not count against a worker.
- **Standing**: after ``trust_after`` spot-checks, an agent whose failed share exceeds
  the baseline's by ``trust_margin`` has fallen; one within half the margin has earned
  trust. A fallen agent's unconfirmed reports leave the pool at once (nothing of its
  vouches any more) and checkers stop spending checks on what only it reported; it
  stays fallen until the operator trusts it. The record is recent: both counts are
  halved when they grow past ``8 * trust_after``, so an earned agent that turns bad
  falls within a few dozen checks, not after its whole history.
- **Quotas** per agent on events a minute and on new proxies and sources an hour
  (0: none), for every agent but the operator's; past them the fold refuses to the DLQ.

Pure: log time only, decided in log order, so every replica and replay agrees.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from events.catalogue import Discovered, Event, ProxyWorked, SitesChecked
from reducers.state import AgentRow, ProxyKey, ProxyRow, State

__all__ = [
    "EARNED",
    "FALLEN",
    "QUOTA",
    "baseline",
    "checked",
    "count",
    "hopeless",
    "level",
    "make_room",
    "over_quota",
    "reindex",
    "sampled",
    "untested",
    "vouched",
]

EARNED, FALLEN = "earned", "fallen"
QUOTA = "quota"  # the DLQ reason
# The baseline before the operator's checkers have measured one: a fifth failing, as
# if seen over 20 checks (free proxies churn; a fresh report is not always still true).
_PRIOR_CHECKS, _PRIOR_FAILED = 20, 4
_BASE_HALVES_AT = 10_000


def _revoked(row: AgentRow) -> bool:
    return row.enrolled_at > 0 and not row.token_sha256


def reindex(state: State) -> None:
    """Recompute who is trusted and who judges, after the settings, an enrolment or a
    standing changed (and on restore)."""
    s = state.settings
    if not s.trust:
        state.trusted = state.judges = state.operators = frozenset()
        return
    agents = state.agents
    named = set(s.trusted_agents)
    if s.guarded:  # the operator's own admin tokens are the operator's, named or not
        named |= {n for n, a in agents.items() if a.role == "admin"}
    state.operators = frozenset(named)  # quotas spare them, revoked or not
    operators = {n for n in named if n not in agents or not _revoked(agents[n])}
    state.judges = frozenset(n for n in operators if n in agents and agents[n].role == "checker")
    earned = {n for n, a in agents.items() if a.standing == EARNED and not _revoked(a)}
    state.trusted = frozenset(operators | earned)


def untested(state: State, agent: str) -> bool:
    """Whether ``agent`` is not trusted now (never while trust is off)."""
    return state.settings.trust and agent not in state.trusted


def level(state: State, row: AgentRow) -> str:
    """How far the fleet believes the agent: trusted (the operator's), earned, untested,
    fallen, or revoked; "trusted" for all while trust is off."""
    if not state.settings.trust:
        return "trusted"
    if _revoked(row):
        return "revoked"
    if row.name in state.operators:
        return "trusted"
    return row.standing or "untested"


def vouched(state: State) -> Callable[[tuple[str, ...]], bool]:
    """Whether the agents that confirmed a proxy put it in the served pool now."""
    if not state.settings.trust:
        return lambda agents: True
    disjoint = state.trusted.isdisjoint  # in C: a view's build asks it of every row
    return lambda agents: not disjoint(agents)


def hopeless(state: State, row: ProxyRow) -> bool:
    """Only discredited agents (fallen, revoked, gone) ever reported it: no check is
    spent on it, and it ages out of the pool by its TTL."""
    if not state.settings.trust:
        return False
    trusted, agents = state.trusted, state.agents
    for name in row.agents:
        if name in trusted:
            return False
        a = agents.get(name)
        if a is not None and a.standing != FALLEN and not _revoked(a):
            return False
    return True


def sampled(key: ProxyKey, share: float) -> bool:
    """Whether a report of ``key`` is in the sample checkers take at once: a stable hash
    of the address, the same for every gateway, independent of the recheck shard."""
    return zlib.crc32(f"{key[0]}:{key[1]}".encode()) % 10_000 < share * 10_000


def baseline(state: State) -> float:
    """The failed share of checks of proxies the operator's agents had just confirmed."""
    checks, failed = state.trust_base.checks, state.trust_base.failed
    return (failed + _PRIOR_FAILED) / (checks + _PRIOR_CHECKS)


def checked(state: State, row: ProxyRow, ts: int, worked: bool) -> None:
    """One of the operator's checkers checked a known proxy (before the row records it):
    a spot-check of whoever reported it, or a baseline check."""
    if row.last_seen <= row.last_failed or ts - row.last_seen > state.settings.spot_window_s * 1000:
        return  # checked since the latest report already, or too late to say about it
    if not row.agents:
        return
    operators = state.operators
    if any(a in operators for a in row.agents):
        base = state.trust_base
        base.checks += 1
        base.failed += not worked
        if base.checks >= _BASE_HALVES_AT:
            base.checks //= 2
            base.failed //= 2
        return
    changed = False
    for name in row.agents:
        a = state.agents.get(name)
        if a is None:
            continue
        a.spot_checks += 1
        a.spot_failed += not worked
        changed |= _judge(state, a)
    if changed:
        reindex(state)


def _judge(state: State, a: AgentRow) -> bool:
    """Settle ``a``'s standing after a spot-check; True when it changed."""
    s = state.settings
    after = max(s.trust_after, 1)  # a setting of 0 means "at the first spot-check"
    if a.spot_checks >= 8 * after:
        a.spot_checks //= 2
        a.spot_failed //= 2
    if a.standing == FALLEN or a.spot_checks < after:
        return False
    share = a.spot_failed / a.spot_checks
    base = baseline(state)
    if share > base + s.trust_margin:
        standing = FALLEN
    elif share <= base + s.trust_margin / 2:
        standing = EARNED
    else:
        standing = a.standing
    if standing == a.standing:
        return False
    a.standing = standing
    return True


def make_room(state: State, agents: tuple[str, ...], agent: str) -> tuple[str, ...]:
    """Provenance is capped; a trusted agent always gets a place, taken from the last
    untrusted one, so that a crowd of fresh names cannot keep a proxy unconfirmable."""
    for i in range(len(agents) - 1, -1, -1):
        if agents[i] not in state.trusted:
            return (*agents[:i], *agents[i + 1 :], agent)
    return agents


def over_quota(state: State, event: Event, ts: int) -> str:
    """Why ``event`` is past its agent's quota ("" when it is not). The caller asks only
    of agents other than the operator's: those have none."""
    name = event.agent
    a = state.agents.get(name)
    if a is None:
        return ""
    s = state.settings
    per_min = s.quota_events_per_min
    if per_min and a.quota_minute == ts // 60_000 and a.quota_events >= per_min:
        return f"{name} sent {a.quota_events} events this minute (quota {per_min})"
    same_hour = a.quota_hour == ts // 3_600_000
    if isinstance(event, ProxyWorked):
        cap = s.quota_proxies_per_hour
        if (
            cap
            and same_hour
            and a.quota_proxies >= cap
            and (event.ip, event.port) not in state.proxies
        ):
            return f"{name} reported {a.quota_proxies} new proxies this hour (quota {cap})"
    elif isinstance(event, SitesChecked) and s.verdicts_guarded and per_min:
        this_minute = a.quota_events if a.quota_minute == ts // 60_000 else 0
        if this_minute + len(event.results) > per_min:
            past = f"{len(event.results)} verdicts more pass the quota ({per_min})"
            return f"{name} sent {this_minute} events this minute; {past}"
    elif isinstance(event, Discovered):
        cap = s.quota_sources_per_hour
        taken = a.quota_sources if same_hour else 0
        if cap and taken + len(event.urls) > cap:
            more = len(event.urls)
            return (
                f"{name} proposed {taken} sources this hour; {more} more passes the quota ({cap})"
            )
    return ""


def count(state: State, a: AgentRow, event: Event, ts: int) -> None:
    """Count an observation ``a`` (not one of the operator's agents) made against its
    quotas, before it is applied."""
    minute = ts // 60_000
    if a.quota_minute != minute:
        a.quota_minute, a.quota_events = minute, 0
    # A round of site verdicts: each verdict, once ``verdicts_guarded``.
    verdicts = type(event) is SitesChecked and state.settings.verdicts_guarded
    a.quota_events += len(event.results) if verdicts else 1  # type: ignore[attr-defined]
    hour = ts // 3_600_000
    if a.quota_hour != hour:
        a.quota_hour, a.quota_proxies, a.quota_sources = hour, 0, 0
    kind = type(event)  # no subclasses; isinstance is slower, and this runs per event
    if kind is ProxyWorked:
        a.quota_proxies += (event.ip, event.port) not in state.proxies  # type: ignore[attr-defined]
    elif kind is Discovered:
        a.quota_sources += len(event.urls)  # type: ignore[attr-defined]
