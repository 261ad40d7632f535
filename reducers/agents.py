"""Per-agent activity: role, last seen, what it published, claims it lost, late events."""

from __future__ import annotations

from events.catalogue import AgentEnrolled
from events.ids import uuid7
from reducers.state import AgentRow, State

__all__ = ["enrolled", "row"]


def row(state: State, name: str) -> AgentRow:
    agent = state.agents.get(name)
    if agent is None:
        agent = AgentRow(name=name)
        state.agents[name] = agent
    return agent


def enrolled(state: State, event: AgentEnrolled, ts: int) -> None:
    """A new token revokes the old one; an empty one (``ppf token revoke``) revokes the
    agent (its role stays as it was): its token stops working and the fold takes nothing
    more from its subjects."""
    agent = row(state, event.name)
    state.tokens.pop(agent.token_sha256, None)
    agent.token_sha256 = event.token_sha256
    if not event.token_sha256:
        return  # its role is kept, for the record
    agent.role = event.role
    state.tokens[event.token_sha256] = event.name
    agent.enrolled_at = ts
    if state.settings.guarded:
        _forget_future(state, event.name, ts + state.settings.id_skew_s * 1000)


def _forget_future(state: State, name: str, horizon_ms: int) -> None:
    """A token issued again starts its agent afresh: ids dated past ``horizon_ms`` (a
    wrong clock, a bug, one forged id) leave its re-send mark, which they would
    otherwise sit above forever (reducers/marks.py; the high-water mark of older logs
    they would mute). A floor past the horizon goes too: nothing it let go is known."""
    cut = uuid7(horizon_ms + 1, bytes(10))  # sorts above every id of horizon_ms
    if state.high_water.get(name, "") >= cut:
        del state.high_water[name]
    mark = state.marks.get(name)
    if mark is not None:
        mark.ids = [i for i in mark.ids if i < cut]
        if mark.floor >= cut:
            mark.floor = ""
