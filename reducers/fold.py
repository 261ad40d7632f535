"""The one generic fold: apply a decoded event at (seq, ts) to every projection it touches.

``ts`` is the JetStream server timestamp of the message in unix ms. A sequence at or
below ``state.last_seq`` was applied already (a redelivery) and changes nothing.

``folding`` is the same fold in steps, for a caller that shares its thread (the live
fold, between the gateway's requests): a round of results gives way after every
``PIECE`` of them. ``fold_single`` is it for an event that is not a round, which has no
step to give way at: the live fold takes those without a generator.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import assert_never

from events.batches import expand
from events.catalogue import (
    OBSERVATIONS,
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
    Located,
    ProxiesChecked,
    ProxyFailed,
    ProxyReported,
    ProxyWorked,
    Released,
    SeedPlanned,
    SiteRuled,
    SitesChecked,
    SourceAdded,
)
from events.keys import DERIVED_PREFIX
from events.validate import result_problems
from reducers import (
    agents,
    deposits,
    geo,
    ledger,
    marks,
    proxies,
    reports,
    sites,
    sources,
    trust,
)
from reducers.admission import INVALID, result_refusal, round_types
from reducers.state import AgentRow, State
from reducers.steps import at_once

__all__ = ["PIECE", "fold", "fold_single", "folding", "skip"]

_OBSERVED = frozenset(OBSERVATIONS)

# Results of a round applied between two steps of ``folding``: about a millisecond of
# new proxies (docs/decisions.md, The fold).
PIECE = 32


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
        if state.recent:
            marks.expire(state.recent, ts)
        state.sweep_bucket = bucket
        state.settings_dirty = True


Refused = list[tuple[int, str, str]]


def fold(state: State, event: AnyEvent, seq: int, ts: int, refused: Refused | None = None) -> bool:
    """Apply one event; False when ``seq`` was already applied, or the event is an
    agent's re-send of one already folded (``seq`` is then passed, nothing changes).

    A ``ProxiesChecked`` is applied result by result, each as the single event it stands
    for; a result the rules refuse (reducers/admission.py) changes nothing and is added
    to ``refused`` as (index, DLQ reason, why), for the caller to keep in the DLQ."""
    if type(event) is ProxiesChecked:
        return at_once(folding(state, event, seq, ts, refused))
    return fold_single(state, event, seq, ts)


def fold_single(state: State, event: AnyEvent, seq: int, ts: int) -> bool:
    """``fold`` of an event that is not a round, in one step: most events (older
    clients send their checks one by one) need no generator to give way inside them."""
    if type(event) is ProxiesChecked:  # its refused results need a list: ``fold``
        raise TypeError("a round is folded by fold or folding, which keep what it refused")
    done = _before(state, event, seq, ts)
    if done is not None:
        return done
    _apply(state, event, seq, ts)
    state.last_seq = seq
    return True


def folding(
    state: State, event: AnyEvent, seq: int, ts: int, refused: Refused | None = None
) -> Generator[None, None, bool]:
    """``fold`` in steps: what it returns, once the generator is done. Between two steps
    the state holds part of a round and is not yet at ``seq``: the caller must neither
    fold another message, nor cut a checkpoint or a snapshot, nor drop the generator
    before it is done (a state cut midway would apply those results again on a replay
    from it)."""
    done = _before(state, event, seq, ts)
    if done is not None:
        return done
    if type(event) is ProxiesChecked:
        yield from _checked(state, event, seq, ts, refused)
    else:
        _apply(state, event, seq, ts)
    state.last_seq = seq
    return True


def _before(state: State, event: AnyEvent, seq: int, ts: int) -> bool | None:
    """What every event meets before its own rules: a sequence applied already (False),
    the sweep's tick, a lookup's record (True: applied here), an agent's re-send (False,
    ``seq`` passed); None when its rules are to be applied."""
    if seq <= state.last_seq:
        return False
    if ts >= state.sweep_bucket * proxies.SWEEP_MS + proxies.SWEEP_MS:
        _tick(state, ts)
    if isinstance(event, Located):
        # The service's record of a lookup, not an agent's doing: no per-agent
        # accounting.
        geo.located(state, event)
        state.last_seq = seq
        return True
    # Events the fold derived from a deposit (events/keys.py) carry the depositing agent
    # but not its numbering, and are kept once by their fixed ids instead.
    if (
        type(event) in _OBSERVED
        and state.settings.agent_subjects
        and event.id[:4] != DERIVED_PREFIX
        and not _first_time(state, event.agent, event.id, ts)
    ):
        state.resent[event.agent] = state.resent.get(event.agent, 0) + 1
        state.last_seq = seq
        return False
    return None


def _first_time(state: State, agent: str, eid: str, ts: int) -> bool:
    """Whether an agent's observation is folded for the first time. Ids are the agent's
    own: each agent has its own mark, so nobody else's ids can shadow its events."""
    settings = state.settings
    if settings.resend_window_s:  # reducers/marks.py: a window of log time
        return marks.remember(state.recent, agent, eid, ts, settings.resend_window_s)
    window = settings.resend_window
    if window:  # reducers/marks.py: ids out of order are folded, re-sends are not
        return marks.see(state.marks, agent, eid, window) == marks.NEW
    # Before the window: its client stamps ids in order as it sends, and its outbox
    # re-sends in order, so an id at or below the highest folded is a re-send.
    if eid <= state.high_water.get(agent, ""):
        return False
    state.high_water[agent] = eid
    return True


def _checked(
    state: State, batch: ProxiesChecked, seq: int, ts: int, refused: Refused | None
) -> Generator[None, None, None]:
    """A round, result by result, as the single events it stands for would be folded
    (``_apply``'s ProxyWorked and ProxyFailed): what is the same for all its results
    (the agent, its source, its lease, what its role may say) is looked up once. A step
    ends after every ``PIECE`` results."""
    settings = state.settings
    agent = state.agents.get(batch.agent) or agents.row(state, batch.agent)
    counted = settings.trust and agent.name not in state.operators
    found = result_problems(
        batch, lab=settings.lab, guarded=settings.guarded, rule=settings.address_rule
    )
    invalid = {j: f"{field}: {why}" for j, field, why in found}
    if settings.guarded and agent.role == "consumer":  # its traffic: reports, never checks
        for j, why in invalid.items():
            agent.rejected += 1
            if refused is not None:
                refused.append((j, INVALID, why))
        reports.traffic(state, agent, batch, ts, skip=invalid.keys())
        return
    allowed = round_types(state, batch)
    src = state.sources.get(batch.source) if batch.source else None
    source = src.url_id if src is not None else batch.source
    credits: list[tuple[ProxyWorked, bool]] = []
    counts = agent.counts
    applied = 0
    for j, single in enumerate(expand(batch)):
        if j and not j % PIECE:
            yield
        reason, why = result_refusal(state, single, allowed, invalid.get(j, ""), ts)
        if reason:
            if refused is not None:
                # Invalid facts name their field already (results[j].port: ...).
                said = why if reason == INVALID else f"results[{j}]: {why}"
                refused.append((j, reason, said))
            if settings.guarded:
                agent.rejected += 1  # and, once guarded, in its rejected: seen by it
            continue  # as a single event refused: in the DLQ
        if applied == 0 and ts > agent.last_seen:
            agent.last_seen = ts
        applied += 1
        if counted:
            trust.count(state, agent, single, ts)
        tag = type(single).__name__
        counts[tag] = counts.get(tag, 0) + 1
        new = _proxy(state, agent, single, ts, source)
        if new is not None and src is not None:
            credits.append((single, new))  # type: ignore[arg-type]
    if src is not None and credits:
        sources.credit(state, src, credits)
    # One touch for the round: every result names the same lease at the same time.
    if applied and batch.lease and not ledger.touch(state, batch.lease, batch.agent, ts):
        agent.late += applied


def _proxy(
    state: State, agent: AgentRow, event: ProxyWorked | ProxyFailed, ts: int, source: str
) -> bool | None:
    """A check of a proxy recorded: for a confirmation, whether the proxy is new (None:
    refused, counted in the agent's ``rejected``); None for a failure."""
    if isinstance(event, ProxyWorked):
        new = proxies.worked(state, event, ts, agent.name, source)
        if new is None:
            agent.rejected += 1
        return new
    if not proxies.failed(state, event, ts, agent.name):
        agent.rejected += 1
    return None


def _apply(state: State, event: AnyEvent, seq: int, ts: int) -> None:
    """The rules of one event, once it is known to be new."""
    settings = state.settings
    kind = type(event)
    observed = kind in _OBSERVED
    agent = state.agents.get(event.agent) or agents.row(state, event.agent)
    if ts > agent.last_seen:
        agent.last_seen = ts
    if observed and settings.trust and agent.name not in state.operators:
        trust.count(state, agent, event, ts)  # the operator's agents have no quotas
    counts = agent.counts
    tag = kind.__name__
    counts[tag] = counts.get(tag, 0) + 1
    match event:
        case ProxyWorked():
            src = state.sources.get(event.source) if event.source else None
            source = src.url_id if src is not None else event.source
            new = _proxy(state, agent, event, ts, source)
            if new is not None and src is not None:
                sources.credit(state, src, [(event, new)])
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case ProxyFailed():
            _proxy(state, agent, event, ts, "")
            if event.lease and not ledger.touch(state, event.lease, event.agent, ts):
                agent.late += 1
        case Leased():
            if not ledger.claim(state, event, seq, ts):
                agent.lost += 1
        case Heartbeat():
            agent.late += ledger.heartbeat(state, event, ts)
            if event.outage != agent.outage:
                agent.outage_since = ts if event.outage else 0
                agent.outage = event.outage
        case Released():
            ledger.on_subject(state, event.target, event.kind, seq)
            if event.kind == "source" and event.lease:  # "" would settle any lease's fetch
                sources.settle(state, event.target, event.lease)
            if not ledger.release(state, event, ts):
                agent.late += 1
        case Fetched():
            if not event.ok:  # per-agent error counts feed the fleet's error rate
                counts["Fetched.failed"] = counts.get("Fetched.failed", 0) + 1
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
            if deposits.deposited(state, event, seq, ts):
                agent.rejected += 1
        case LeaseReset():
            ledger.on_subject(state, event.target, event.kind, seq)
            ledger.reset(state, event)
        case SeedPlanned():
            ledger.plan(state, event)
        case AgentEnrolled():
            agents.enrolled(state, event, ts)
            if state.settings.trust:  # a revoked agent vouches for nothing more
                trust.reindex(state)
        case Configured():
            narrower = (state.settings.lab and not event.settings.lab) or (
                event.settings.address_rule > state.settings.address_rule
            )
            state.settings = event.settings
            state.settings_dirty = True
            trust.reindex(state)
            if narrower:
                proxies.purge_refused(state)
        case ProxyReported() if event.outcome == "blocked":
            sites.reported(state, event, ts)
        case ProxyReported():
            if not proxies.reported(state, event, ts, agent):
                agent.rejected += 1  # unknown, not failed, suspect already, or over budget
        case DepositFolded():
            deposits.folded(state, event)
        case DepositRejected():
            deposits.rejected(state, event)
        case SitesChecked():
            sites.checked(state, event, ts)
        case SiteRuled():
            site = event.rule.site
            if event.removed:
                state.site_rules.pop(site, None)
            else:
                state.site_rules[site] = event.rule
            if event.url and not event.removed:
                state.site_urls[site] = event.url
            else:
                state.site_urls.pop(site, None)
            state.settings_dirty = True  # meta holds them
        case Located() | ProxiesChecked():  # folded before they get here (fold above)
            pass
        case _:
            assert_never(event)
