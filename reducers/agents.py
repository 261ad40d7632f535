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
    agent = row(state, event.name)
    state.tokens.pop(agent.token_sha256, None)  # a new token revokes the old one
    agent.role = event.role
    agent.token_sha256 = event.token_sha256
    state.tokens[event.token_sha256] = event.name
    agent.enrolled_at = ts
