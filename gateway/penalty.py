"""Agents cut off for what they make the log keep: an agent whose refused input (what
the fold refused on its own subjects, kept in the log and copied to the DLQ) passes
``REFUSED_BYTES_PER_MIN`` in a minute is cut off for ``PENALTY_S``: its NATS connections
are kicked and its logins refused (gateway/natsauth.py), and its HTTP calls answered 403.

The log holds what an agent publishes before the fold can judge it: NATS has no
per-login rate, so the bound is on time. The worst one agent can add to the stream is
twice what it sends between the moment its refused input passes the bound and the
moment it is cut: the copy in the DLQ is no larger than the message. With a link of R
bytes a second and a detection time D (the fold's lag, ``every_s`` here and the kicker's
second), that is 2 * (REFUSED_BYTES_PER_MIN + R * D) a penalty, and a penalty lasts
``PENALTY_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import structlog
from aiohttp import web

from projections.tasks import stop_tasks

__all__ = ["PENALTIES", "PENALTY_S", "REFUSED_BYTES_PER_MIN", "Penalties", "watching"]

log = structlog.get_logger("ppf.penalty")

REFUSED_BYTES_PER_MIN = 1024 * 1024
PENALTY_S = 600.0


class Penalties:
    """Who is cut off until when (monotonic), from the fold's ``refused_bytes``."""

    def __init__(
        self,
        refused: Callable[[], dict[str, int]],
        *,
        per_min: int = REFUSED_BYTES_PER_MIN,
        penalty_s: float = PENALTY_S,
        every_s: float = 1.0,
    ) -> None:
        self._refused = refused
        self.per_min = per_min
        self.penalty_s = penalty_s
        self.every_s = every_s
        self.until: dict[str, float] = {}
        self.cut_off: dict[str, int] = {}  # how often each agent was cut off
        self._seen: deque[tuple[float, dict[str, int]]] = deque()

    def penalized(self, agent: str, now: float | None = None) -> float:
        """Seconds ``agent`` stays cut off (0: not cut off)."""
        until = self.until.get(agent)
        if until is None:
            return 0.0
        left = until - (time.monotonic() if now is None else now)
        if left <= 0:
            del self.until[agent]
            return 0.0
        return left

    def sample(self, now: float) -> list[str]:
        """Compare the counts now with a minute ago; cut off who passed the bound. The
        agents cut off now."""
        totals = dict(self._refused())
        self._seen.append((now, totals))
        while self._seen and now - self._seen[0][0] > 60.0:
            self._seen.popleft()
        _, before = self._seen[0]
        cut = []
        for agent, total in totals.items():
            if total - before.get(agent, 0) > self.per_min and not self.penalized(agent, now):
                self.until[agent] = now + self.penalty_s
                self.cut_off[agent] = self.cut_off.get(agent, 0) + 1
                cut.append(agent)
                log.warning(
                    "agent_cut_off",
                    agent=agent,
                    refused_bytes=total - before.get(agent, 0),
                    penalty_s=self.penalty_s,
                )
        return cut


PENALTIES = web.AppKey("penalties", Penalties)


async def watching(app: web.Application) -> AsyncIterator[None]:
    """``Penalties.sample`` every ``every_s`` while the app runs."""
    penalties = app[PENALTIES]

    async def loop() -> None:
        while True:
            await asyncio.sleep(penalties.every_s)
            penalties.sample(time.monotonic())

    task = asyncio.create_task(loop(), name="ppf-penalties")
    yield
    await stop_tasks([task], 5)  # a bare cancel can be lost on 3.11 (projections/tasks.py)
