"""The dashboard's summaries of what the pool is worth, for ``/v1/stats``: the sites it
learned (how many, the share of judged proxies through, the answers this hour) and its
quality (uptime, speed), with no site named (which sites the traffic goes to is the
consumers' business: ``GET /v1/sites`` names them, to an admin).

Each is a walk (of every site cell, of the served pool), so it runs in the background, at
most every ``PANELS_S``, the loop given back between steps; ``/v1/stats`` answers with the
last one made and never waits for a walk (None before the first)."""

from __future__ import annotations

import asyncio
import time
from statistics import median
from typing import Any

from aiohttp import web

from events.mint import now_ms
from gateway.http import FOLD
from gateway.queries import cells_in_steps
from gateway.views import POOL_VIEW
from projections.core.quality import stable_since, uptime
from projections.core.readmodels import ProxyFilter, SiteTally
from projections.tasks import stop_tasks

__all__ = ["PANELS", "PANELS_S", "Panels"]

PANELS_S = 10.0
_STEP = 5_000  # served proxies a step of the quality walk


class Panels:
    def __init__(self, every_s: float = PANELS_S) -> None:
        self.every_s = every_s
        self.last: dict[str, Any] = {"sites": None, "quality": None}
        self._at = -float("inf")
        self._walk: asyncio.Task[None] | None = None

    def get(self, app: web.Application) -> dict[str, Any]:
        """The last summaries; a new walk started when they are due and none runs."""
        if time.monotonic() - self._at >= self.every_s and (
            self._walk is None or self._walk.done()
        ):
            self._at = time.monotonic()
            self._walk = asyncio.create_task(self._made(app), name="ppf-gateway-panels")
        return self.last

    async def stop(self) -> None:
        if self._walk is not None:
            await stop_tasks([self._walk], 5)  # a bare cancel can be lost on 3.11

    async def _made(self, app: web.Application) -> None:
        state, now = app[FOLD].state, now_ms()
        tally = SiteTally(now, state.site_hour)
        async for step in cells_in_steps(state.sites.values()):
            tally.add(step)
        self.last = {
            "sites": _sites(tally.answer()),
            "quality": await _quality(app, state, now),
        }


def _sites(rows: list[dict[str, Any]]) -> dict[str, Any]:
    through = sum(int(r["through"]) for r in rows)
    blocked = sum(int(r["blocked"]) for r in rows)
    return {
        "learned": sum(1 for r in rows if r["through"] or r["blocked"]),
        "through": through,
        "turned_away": blocked,
        "through_share": round(through / (through + blocked), 4) if through + blocked else None,
        "probes_this_hour": sum(int(r["probes_this_hour"]) for r in rows),
        "traffic_this_hour": sum(int(r["traffic_this_hour"]) for r in rows),
    }


async def _quality(app: web.Application, state: Any, now: int) -> dict[str, Any]:
    """Uptime (the share of the known time of the last days up) and download speed over
    the pool as ``GET /v1/proxies`` serves it."""
    view = await app[POOL_VIEW].view(state)
    uptimes: list[float] = []
    speeds: list[int] = []
    runs_s: list[int] = []  # how long each has worked without a break
    for i, v in enumerate(view.select(ProxyFilter(), now, limit=0)):
        q = v.quality
        if (share := uptime(q, now)) is not None:
            uptimes.append(share)
        if q is not None and q.speed_kb_s:
            speeds.append(q.speed_kb_s)
        if since := stable_since(q):
            runs_s.append(max(0, now - since) // 1000)
        if i % _STEP == _STEP - 1:
            await asyncio.sleep(0)
    return {
        "working_without_a_break": len(runs_s),
        "unbroken_median_s": int(median(runs_s)) if runs_s else None,
        "with_uptime": len(uptimes),
        "uptime_median_pct": round(100 * median(uptimes), 1) if uptimes else None,
        "uptime_90_share": round(sum(u >= 0.9 for u in uptimes) / len(uptimes), 4)
        if uptimes
        else None,
        "with_speed": len(speeds),
        "speed_median_kb_s": int(median(speeds)) if speeds else None,
    }


PANELS = web.AppKey("panels", Panels)
