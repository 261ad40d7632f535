"""The pool view every read of the gateway shares (projections/core/poolview.py): kept fresh
as the fold moves, built in steps while the old one answers; and the pool's census."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from events.mint import now_ms
from gateway.http import FOLD
from projections.core.poolview import PoolView, ThroughKept, building, dropping, held
from projections.foreground import Foreground, drive
from reducers import State

__all__ = ["POOL_VIEW", "PoolViewKeeper", "pool_census"]

log = structlog.get_logger("ppf.gateway")


class PoolViewKeeper:
    """Holds the current pool view; rebuilds it when the fold moved and it is stale.

    Stale means older than ``1 / share`` times its own build took (within ``min_age_s``
    and ``max_age_s``), so rebuilding takes at most ``share`` of the event loop's time: a
    small pool's view follows the fold within a tenth of a second (a death served a
    second longer cost the churn lab's precision), a million proxies' (seconds to build)
    is not rebuilt every second while the fold moves. A build gives the loop back every
    ``slice_s`` (``projections.core.poolview.building``), so the other requests (a lease,
    /v1/stats) are answered meanwhile. One build at a time.
    """

    def __init__(
        self,
        *,
        share: float = 0.1,
        min_age_s: float = 0.1,
        max_age_s: float = 30.0,
        slice_s: float = 0.002,
        wait_s: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
        foreground: Foreground | None = None,
    ) -> None:
        self.share, self.min_age_s, self.max_age_s = share, min_age_s, max_age_s
        # A build nobody waits for (a big pool's) and the old views' release yield to
        # the requests in flight between their steps; a build a request waits for not.
        self.foreground = foreground
        self.slice_s, self.wait_s = slice_s, wait_s
        self.clock = clock
        self.current: PoolView | None = None
        self._built = 0.0
        self._age_s = min_age_s  # how long the current one stays fresh
        self._took = 0.0  # the loop's time the last build took, its slices summed
        self._rows = 0  # the proxies it built from
        self._task: asyncio.Task[PoolView] | None = None
        self._retiring: set[asyncio.Task[tuple[None, float]]] = set()
        self._through = ThroughKept()  # the sites' rows that did not move, view to view

    async def get(self, request: web.Request) -> PoolView:
        return await self.view(request.app[FOLD].state)

    def stale(self, state: State) -> bool:
        view = self.current
        if view is None:
            return True
        return view.seq != state.last_seq and self.clock() - self._built >= self._age_s

    async def view(self, state: State, *, idle: bool | None = None) -> PoolView:
        """The current view, or a newer one when one is due and cheap to build.

        Due: for a query (``idle`` None), once the current one is stale; for /v1/stats,
        which says the ``seq`` it saw, never while the fold moves (``idle`` False) and
        as soon as it moved once the fold is idle (True). A build that last took at most
        ``wait_s`` (a small pool's) is waited for; a longer one (a big pool's) runs
        while the current view answers: every await costs a round of the loop's
        other work (the fold's slices, the build's own), which a big pool's build has
        many of (docs/decisions.md, The gateway)."""
        view = self.current
        if view is None:
            return await asyncio.shield(self._start(state))
        if view.seq == state.last_seq or idle is False:
            return view
        cheap = self._cheap(state)
        if not (self.stale(state) or (idle and cheap)):
            return view
        task = self._start(state)
        if cheap:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.wait_s)
        return self.current or view

    def _cheap(self, state: State) -> bool:
        """Whether the next build is one to wait for: the last one was short and the pool
        has not grown much since (a catch-up that brings a hundred thousand proxies
        into a pool of ten would otherwise be waited for on the last one's figure)."""
        return self._took <= self.wait_s and len(state.proxies) <= 2 * self._rows + 1_024

    def _start(self, state: State) -> asyncio.Task[PoolView]:
        if self._task is None or self._task.done():
            waited = self.current is None or self._cheap(state)
            self._task = asyncio.get_running_loop().create_task(self._build(state, waited))
        return self._task

    async def _build(self, state: State, waited: bool) -> PoolView:
        fg = None if waited else self.foreground
        rows = len(state.proxies)
        built = building(state, now_ms(), self._through)
        view, self._took = await drive(built, self.slice_s, self.clock, fg)
        self._rows = rows
        self._built = self.clock()
        old, self.current = self.current, view  # readers see the old or the new one
        self._age_s = min(self.max_age_s, max(self.min_age_s, self._took / self.share))
        if old is not None:
            # Freeing a big pool's views at once holds the loop: the parts
            # that hold them go a step at a time (unless a request still reads the old
            # one), and with them the views.
            holding, old = held(old), None
            task = asyncio.get_running_loop().create_task(
                drive(dropping(holding), self.slice_s, self.clock, self.foreground)
            )
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return view


POOL_VIEW = web.AppKey("pool_view", PoolViewKeeper)


async def pool_census(
    app: web.Application, state: State, now: int, *, idle: bool
) -> dict[str, Any]:
    """The pool as ``GET /v1/proxies`` serves it (``PoolView.census``: alive is
    what it serves; unconfirmed, suspect and mitm on their own lines), at the view's
    ``seq``; stale from the counts the fold keeps (``reducers/pool.py``). While the fold
    moves (not ``idle``) the view there is answers, rebuilt by the queries' own
    rhythm, so /v1/stats costs nothing; idle, the applied sequence's once it is built
    (``PoolViewKeeper.view``: a large pool's is built while the old one answers)."""
    view = await app[POOL_VIEW].view(state, idle=idle)
    stale = state.composition.bands(now, state.settings.proxy_ttl_s)["stale"]
    return {**view.census(now), "stale": sum(stale.values()), "known": len(state.proxies)}
