"""Whether the fold may believe an event, given the subject it arrived on.

Once a ``Configured`` switches ``agent_subjects`` on, an agent's NATS credentials let
it write only ``ppf.in.<its name>.>``, and everything else is the service's. The
publisher is then known from the subject alone, so the fold believes an event only
when its fields agree with where it came from: the subject its type and fields give,
the agent it names, an enrolled agent, a type that agent's role may publish. Before
the switch events are taken as they always were, so older logs replay to the same
projection. Then the facts themselves (events/validate.py), under the settings of
that log position. Pure: the same state, subject and event give the same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from events import (
    AGENT_PREFIX,
    OBSERVATIONS,
    SUBJECT_TAILS,
    AnyEvent,
    Event,
    ProxiesChecked,
    ProxyFailed,
    ProxyWorked,
    SitesChecked,
    SubjectError,
    subject_for,
)
from events.keys import DERIVED_PREFIX
from events.roles import ROLE_NATS_EVENTS, may_publish, may_publish_on_nats
from events.validate import id_problem, problem
from reducers import marks, trust
from reducers.proxies import SWEEP_MS
from reducers.state import State

__all__ = [
    "FORBIDDEN",
    "INVALID",
    "PAST_WINDOW",
    "refusal",
    "refused_event",
    "result_refusal",
    "round_types",
]

FORBIDDEN = "forbidden"  # DLQ reasons: said by whom it may not be said,
INVALID = "invalid"  # or facts that cannot be (events/validate.py),
PAST_WINDOW = "stale"  # or an id older than its agent's re-send window (reducers/marks.py)

_SKIP = len(AGENT_PREFIX)


_OK = ("", "")


def refusal(state: State, subject: bytes, event: Event, ts: int) -> tuple[str, str]:
    """(DLQ reason, why) when the event at log time ``ts`` may not be folded; ("", "")
    when it may."""
    settings = state.settings
    if not settings.agent_subjects:
        return _OK
    kind = type(event)
    tail = SUBJECT_TAILS.get(kind)
    plain = tail is not None and _plainly_admitted(state, subject, event, kind, tail)
    if not plain:
        why = _forbidden(state, subject, event)
        if why:
            return FORBIDDEN, why
        field, why = problem(
            event, lab=settings.lab, guarded=settings.guarded, rule=settings.address_rule
        )
        if why:
            return INVALID, f"{field}: {why}"
    if (
        kind in _OBSERVED
        and settings.guarded
        and (why := _id_refused(subject, event, ts, settings.id_skew_s * 1000))
    ):
        return INVALID, f"id: {why}"
    if kind in _OBSERVED and settings.resend_window_s and event.id[:4] != DERIVED_PREFIX:
        what, why = _outside_window(state, event, ts)
        if what:
            return what, why
    elif kind in _OBSERVED and settings.resend_window and event.id[:4] != DERIVED_PREFIX:
        floor = marks.floor_at_or_above(state.marks, event.agent, event.id)
        if floor:
            return PAST_WINDOW, (
                f"id {event.id} is at or below the oldest id {event.agent}'s re-send window"
                f" keeps ({floor}): a re-send from long ago, or a clock far behind"
            )
    if (
        settings.verdicts_guarded
        and isinstance(event, SitesChecked)
        and (why := _stray_site(state, event))
    ):
        return FORBIDDEN, why
    if kind in _OBSERVED and settings.trust and event.agent not in state.operators:
        why = trust.over_quota(state, event, ts)
        if why:
            return trust.QUOTA, why
    return _OK


def _stray_site(state: State, batch: SitesChecked) -> str:
    """Why an agent not trusted now may not give these verdicts: they name a site that
    is not one of the operator's targets ("" when they may). One untested checker's
    invented sites took every slot of the table once."""
    if not state.settings.trust or batch.agent in state.trusted:
        return ""
    for r in batch.results:
        if r.site not in state.site_rules:
            return (
                f"{batch.agent} is not trusted: its site verdicts are taken on the "
                f"operator's targets only, and {r.site} is not one"
            )
    return ""


_OBSERVED = frozenset(OBSERVATIONS)
_AGENTS = AGENT_PREFIX.encode()


def _outside_window(state: State, event: Event, ts: int) -> tuple[str, str]:
    """(DLQ reason, why) when the re-send window in log time may not take the event's
    id (reducers/marks.py): no date, older than the window, or a window full."""
    s = state.settings
    quota = s.quota_events_per_min if s.trust and event.agent not in state.operators else 0
    cap = marks.recent_cap(quota, s.resend_window_s, SWEEP_MS)
    what, why = marks.recent_refusal(
        state.recent, event.agent, event.id, ts, s.resend_window_s, cap
    )
    return {"invalid": INVALID, "stale": PAST_WINDOW, "full": trust.QUOTA}.get(what, ""), why


def _id_refused(subject: bytes, event: Event, ts: int, skew_ms: int) -> str:
    """Why an observation's id may not be folded once ``guarded``: the service's derived
    ids (events/keys.py) only on its own subjects; an agent's a UUIDv7 not dated past
    the message's log time by more than the skew setting."""
    if event.id[:4] == DERIVED_PREFIX and not subject.startswith(_AGENTS):
        return ""
    return id_problem(event.id, ts, skew_ms)


def refused_event(state: State, event: Event, reason: str, why: str) -> None:
    """What a refusal leaves in the state besides its DLQ entry. Once ``guarded``, the
    agent's ``rejected`` counts it, unless it is a forgery (``forbidden``: the name it
    carries may not be the sender's). Per replica: its latest reason, for the agent."""
    if reason == FORBIDDEN:
        return
    state.refusals[event.agent] = f"{reason}: {why}"
    if state.settings.guarded and (agent := state.agents.get(event.agent)) is not None:
        agent.rejected += 1


def round_types(state: State, batch: ProxiesChecked) -> frozenset[type]:
    """What the results of ``batch`` may be, by what its agent's role may say (the
    gateway's table, events/roles.py: a worker reports working proxies only). Rounds
    before per-agent subjects, and those derived from a deposit (the service's), may
    hold both."""
    if not state.settings.agent_subjects or batch.id[:4] == DERIVED_PREFIX:
        return _BOTH
    row = state.agents.get(batch.agent)
    role = row.role if row is not None else ""
    return frozenset(t for t in _BOTH if may_publish(role, t.__name__))


_BOTH: frozenset[type] = frozenset({ProxyWorked, ProxyFailed})


def result_refusal(
    state: State, single: ProxyWorked | ProxyFailed, allowed: frozenset[type], invalid: str, ts: int
) -> tuple[str, str]:
    """(DLQ reason, why) when one result of a round, as the single event it stands for
    (``events.batches.expand``), may not be folded; ("", "") when it may. ``invalid`` is
    what events.validate.result_problems found wrong with it, ``allowed`` the round's
    ``round_types``. The round itself passed ``refusal`` (subject, agent, envelope)."""
    if invalid:
        return INVALID, invalid
    if type(single) not in allowed:
        row = state.agents.get(single.agent)
        role = row.role if row is not None else "none"
        return FORBIDDEN, f"role {role} may not report {type(single).__name__}"
    if state.settings.trust and single.agent not in state.operators:
        why = trust.over_quota(state, single, ts)
        if why:
            return trust.QUOTA, why
    return _OK


def _plainly_admitted(
    state: State, subject: bytes, event: Any, kind: type, tail: Callable[[Any], str]
) -> bool:
    """The usual case, decided with as few calls as it takes (the fold asks it of every
    event): on an agent's own subject, an enrolled agent of a role that may say it, on
    the subject its fields give; on the service's, the subject its fields give; and sound
    facts. False says nothing: the full checks then find the reason, or admit it."""
    said = subject.decode(errors="replace")  # not text: the full checks say so
    if said.startswith(AGENT_PREFIX):
        end = said.find(".", _SKIP)
        publisher = said[_SKIP:end]
        agent = state.agents.get(publisher)
        if (
            agent is None
            or event.agent != publisher
            or not agent.token_sha256
            or agent.role not in _NATS_ROLES.get(kind, _NOBODY)
            or said[end + 1 :] != tail(event)
        ):
            return False
    elif said[4:] != tail(event) or not said.startswith("ppf."):
        return False
    settings = state.settings
    return not problem(
        event, lab=settings.lab, guarded=settings.guarded, rule=settings.address_rule
    )[1]


# Event type -> the roles that may publish it on their own subjects.
_NATS_ROLES: dict[type, frozenset[str]] = {
    kind: frozenset(r for r in ROLE_NATS_EVENTS if may_publish_on_nats(r, kind.__name__))
    for kind in get_args(AnyEvent)
}
_NOBODY: frozenset[str] = frozenset()


def _expected(event: Event) -> str:
    """The whole subject of ``event`` (the service's form), for comparing and for
    telling; a SubjectError when its fields cannot make one."""
    tail = SUBJECT_TAILS.get(type(event))
    return "ppf." + str(tail(event)) if tail is not None else subject_for(event)


def _forbidden(state: State, subject: bytes, event: Event) -> str:
    try:
        said = subject.decode()
    except UnicodeDecodeError:
        return "the subject is not text"
    if not said.startswith(AGENT_PREFIX):
        # The service's own subjects: only the service user may write them (nats.conf),
        # what it publishes for a caller it checked first; the key must still be right.
        try:
            expected = _expected(event)
        except SubjectError as exc:
            return str(exc)
        if said != expected:
            return f"{type(event).__name__} belongs on {expected}, not {said}"
        return ""
    end = said.find(".", _SKIP)
    publisher = said[_SKIP:end] if end > 0 else ""
    if event.agent != publisher:
        return f"agent {event.agent!r} in an event published by {publisher!r}"
    agent = state.agents.get(publisher)
    if agent is None or not agent.token_sha256:
        return f"{publisher!r} is not an enrolled agent"
    kind = type(event)
    if agent.role not in _NATS_ROLES.get(kind, _NOBODY):
        return f"role {agent.role or 'none'} may not publish {kind.__name__} on its own subjects"
    tail = SUBJECT_TAILS.get(kind)
    if tail is None or said[end + 1 :] != tail(event):
        try:
            expected = _expected(event)
        except SubjectError as exc:
            return str(exc)
        if said[end:] != expected[3:]:
            return f"{kind.__name__} belongs on {AGENT_PREFIX}{publisher}{expected[3:]}"
    return ""
