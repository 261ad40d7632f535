"""Whether the fold may believe an event, given the subject it arrived on.

Once a ``Configured`` switches ``agent_subjects`` on, an agent's NATS credentials let
it write only ``ppf.in.<its name>.>``, and everything else is the service's. The
publisher is then known from the subject alone, so the fold believes an event only
when its fields agree with where it came from: the subject its type and fields give,
the agent it names, an enrolled agent, a type that agent's role may publish. Before
the switch events are taken as they always were, so older logs replay to the same
projection. Then the facts themselves (events/validate.py), under the settings of that log position.
Pure: the same state, subject and event give the same answer.
"""

from __future__ import annotations

from events import AGENT_PREFIX, Event, SubjectError, subject_for
from events.roles import may_publish_on_nats
from events.validate import problem
from reducers.state import State

__all__ = ["FORBIDDEN", "INVALID", "refusal"]

FORBIDDEN = "forbidden"  # DLQ reasons: said by whom it may not be said,
INVALID = "invalid"  # or facts that cannot be (events/validate.py)

_AGENT = AGENT_PREFIX.encode()
_SKIP = len(_AGENT)


def refusal(state: State, subject: bytes, event: Event) -> tuple[str, str]:
    """(DLQ reason, why) when the event may not be folded; ("", "") when it may."""
    settings = state.settings
    if not settings.agent_subjects:
        return "", ""
    why = _forbidden(state, subject, event)
    if why:
        return FORBIDDEN, why
    field, why = problem(event, lab=settings.lab)
    if why:
        return INVALID, f"{field}: {why}"
    return "", ""


def _forbidden(state: State, subject: bytes, event: Event) -> str:
    try:
        expected = subject_for(event)
    except SubjectError as exc:
        return str(exc)
    if not subject.startswith(_AGENT):
        # The service's own subjects: only the service user may write them (nats.conf),
        # what it publishes for a caller it checked first; the key must still be right.
        if subject != expected.encode():
            return f"{type(event).__name__} belongs on {expected}, not {subject.decode()}"
        return ""
    end = subject.find(b".", _SKIP)
    publisher = subject[_SKIP:end].decode() if end > 0 else ""
    if event.agent != publisher:
        return f"agent {event.agent!r} in an event published by {publisher!r}"
    agent = state.agents.get(publisher)
    if agent is None or not agent.token_sha256:
        return f"{publisher!r} is not an enrolled agent"
    kind = type(event).__name__
    if not may_publish_on_nats(agent.role, kind):
        return f"role {agent.role or 'none'} may not publish {kind} on its own subjects"
    if subject[end:] != expected[3:].encode():
        return f"{kind} belongs on {AGENT_PREFIX}{publisher}{expected[3:]}"
    return ""
