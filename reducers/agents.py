"""Per-agent activity: role, last seen, what it published, claims it lost, late events."""

from __future__ import annotations

from events.catalogue import AgentEnrolled
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
