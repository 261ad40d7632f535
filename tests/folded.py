"""A log folded message by message through the fold's own door (``Folder``), as the
live fold and replay take it, on the subject its publisher could write: an agent's
observations on ``ppf.in.<agent>.>``, the operator's settings and enrolments on the
service's subjects. Pure state, no transport: for the reducers' rules.
"""

from __future__ import annotations

from typing import Any

import msgspec

import events as ev
from events import agent_subject, subject_for
from projections.core.readmodels import ProxyFilter, query_proxies
from projections.folder import Folder
from reducers import State, trust
from tests.helpers import eid, worked

T0 = 1_800_000_000_000
OPERATOR = ("w-own", "c-own")  # the operator's worker and checker


def settings(**kw: Any) -> ev.Settings:
    base = ev.Settings(agent_subjects=True, trust=True, trusted_agents=OPERATOR)
    return msgspec.structs.replace(base, **kw)


class FoldedLog:
    """A log folded message by message; refusals kept as (reason, why)."""

    def __init__(self, **kw: Any) -> None:
        self.refused: list[tuple[str, str]] = []
        self.folder = Folder(State(), on_reject=self._refused)
        self.state = self.folder.state
        self.seq = 0
        self.messages: list[tuple[int, int, bytes, bytes]] = []
        self.service(ev.Configured(id=eid(), agent="admin", at=0, settings=settings(**kw)))
        for name, role in (("w-own", "worker"), ("c-own", "checker")):
            self.enrol(name, role)

    def _refused(self, seq: int, subject: bytes, payload: bytes, exc: ev.DecodeError) -> None:
        self.refused.append((str(exc.reason), str(exc)))

    def _put(self, subject: str, event: ev.Event, at_s: float) -> None:
        self.seq += 1
        msg = (self.seq, T0 + int(at_s * 1000), subject.encode(), ev.encode(event))
        self.messages.append(msg)
        self.folder.apply([msg])

    def service(self, event: ev.Event, at_s: float = 0) -> None:
        self._put(subject_for(event), event, at_s)

    def enrol(self, name: str, role: ev.Role, token: str = "t") -> None:
        sha = ev.token_sha256(token) if token else ""
        event = ev.AgentEnrolled(
            id=eid(), agent="admin", at=0, name=name, role=role, token_sha256=sha
        )
        self.service(event)

    def says(self, event: ev.Event, at_s: float = 0) -> None:
        self._put(agent_subject(event), event, at_s)

    def report(self, agent: str, ip: str, at_s: float = 0, port: int = 8080) -> None:
        self.says(worked(ip, port, agent=agent), at_s)

    def check(self, ip: str, ok: bool, at_s: float, port: int = 8080) -> None:
        if ok:
            self.says(worked(ip, port, agent="c-own"), at_s)
        else:
            failed = ev.ProxyFailed(
                id=eid(), agent="c-own", at=0, ip=ip, port=port, proto="http", error="timeout"
            )
            self.says(failed, at_s)

    def ts(self, at_s: float) -> int:
        """The log time of ``at_s`` seconds into this log."""
        return T0 + int(at_s * 1000)

    def served(self, at_s: float) -> set[str]:
        rows = query_proxies(self.state, T0 + int(at_s * 1000), ProxyFilter(), limit=0)
        return {r.ip for r in rows}

    def level(self, name: str) -> str:
        return trust.level(self.state, self.state.agents[name])


def ip(i: int) -> str:
    return f"45.{60 + i // 250}.{i % 250}.{1 + i % 7}"
