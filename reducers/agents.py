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
    agent.role = event.role
    agent.token_sha256 = event.token_sha256
    agent.enrolled_at = ts
