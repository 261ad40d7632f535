"""The endpoint's figures, sent to its gateways for their dashboard: what each of its
processes did since it started (the outcomes ``/metrics`` counts) and its latencies to a
first byte since the last report, every ``FIGURES_S`` under the endpoint's own name
(``POST /v1/endpoints/figures``). An endpoint without a name keeps them to itself; a
report no gateway took is a log line, and the next one carries the counts all the same."""

from __future__ import annotations

import asyncio
import os
import socket

import msgspec
import structlog

from endpoint.feed import Feed
from endpoint.router.outcomes import Outcomes
from events.wire import EndpointFigures

__all__ = ["FIGURES_S", "Figures"]

log = structlog.get_logger("ppf.serve")

FIGURES_S = 5.0


class Figures:
    def __init__(self, feed: Feed, outcomes: Outcomes, every_s: float = FIGURES_S) -> None:
        self.feed, self.outcomes, self.every_s = feed, outcomes, every_s
        # Which process of the endpoint this is: each of ppf serve's workers is one.
        self.process = f"{socket.gethostname()[:40]}:{os.getpid()}"
        self.sent = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.feed.identity is not None:
            self._task = asyncio.create_task(self._run(), name="ppf-serve-figures")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.report()

    async def report(self) -> None:
        latencies = self.outcomes.first_byte_ms
        figures = EndpointFigures(
            process=self.process,
            counts=dict(self.outcomes.counts),
            first_byte_ms=[round(ms, 1) for ms in latencies],
        )
        latencies.clear()
        if self.feed.identity is None:  # figures go under the endpoint's own name
            return
        body = msgspec.to_builtins(figures)
        answer = await self.feed.api.endpoint_figures(body, token=self.feed.identity[1])
        if answer.ok:
            self.sent += 1
        else:
            log.warning("figures_not_sent", answer=f"{answer.status} {answer.text(190)}")
