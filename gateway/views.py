"""The pool view every read of the gateway shares (projections/core/poolview.py): kept fresh
as the fold moves, built in steps while the old one answers; and the pool's census."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from aiohttp import web

from events.mint import now_ms
from gateway.http import FOLD
from projections.core.poolview import PoolView, building, dropping, held
from projections.core.through import ThroughKept
from projections.foreground import Foreground, drive
from projections.tasks import stop_tasks
from reducers import State
from reducers.state import ProxyKey

__all__ = ["POOL_VIEW", "PoolViewKeeper", "following", "pool_census"]

log = structlog.get_logger("ppf.gateway")

FOLLOW_S = 0.05  # how often the view looks at the fold (PoolViewKeeper.follow)


class PoolViewKeeper:
    """Holds the current pool view; rebuilds it when the fold moved and it is stale.

    Stale means older than ``1 / share`` times its own build took (within ``min_age_s``
    and ``max_age_s``), so rebuilding takes at most ``share`` of the event loop's time
    while the fold moves: a small pool's view follows the fold within a tenth of a
    second (a death served a second longer cost the churn lab's precision), a million
    proxies' (seconds to build) is not rebuilt every second while the fold moves; while
    it catches up with a backlog (``catching_up``), every ``max_age_s`` (rebuilding as
    it went took a sixth to a quarter of a catch-up's time, `ppf bench fold`). Once
    the fold has stood still for ``settled_s`` (a catch-up's end, a burst folded), the
    view is stale at once: the fold no longer wants the loop, and what it folded is
    served within a second. A build gives the loop back every ``slice_s``
    (``projections.core.poolview.building``), so the other requests (a lease, /v1/stats)
    are answered meanwhile. One build at a time; each after the first copies only the
    rows that changed since the one before (``State.view_changes``), unless what it
    was built under changed (the state itself, trust, the TTL) or most rows did.
    """

    def __init__(
        self,
        *,
        share: float = 0.1,
        min_age_s: float = 0.1,
        max_age_s: float = 30.0,
        slice_s: float = 0.002,
        wait_s: float = 0.01,
        settled_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        foreground: Foreground | None = None,
        catching_up: Callable[[], bool] = lambda: False,
    ) -> None:
        self.share, self.min_age_s, self.max_age_s = share, min_age_s, max_age_s
        self.settled_s = settled_s
        self.catching_up = catching_up  # the fold's: far behind the log's head
        self._moved = (-1, 0.0)  # the fold's sequence as last seen, and since when
        self._basis: tuple[object, ...] | None = None  # what the current view was built under
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

    def wanted(self, state: State) -> bool:
        """Whether a build is under way or due: what users wait on, which a timed
        checkpoint's cut lets go first (``FoldService.cut_waits_for``). Never before the
        first build was asked for (an app not started holds no checkpoint back)."""
        if self._task is None:
            return False
        return not self._task.done() or self.due(state)

    async def get(self, request: web.Request) -> PoolView:
        return await self.view(request.app[FOLD].state)

    def due(self, state: State) -> bool:
        view = self.current
        if view is None:
            return True
        now = self.clock()
        if state.last_seq != self._moved[0]:
            self._moved = (state.last_seq, now)
        if view.seq == state.last_seq:
            return False
        if self.catching_up():  # the fold wants the loop: a view at most max_age_s old
            return now - self._built >= self.max_age_s
        return now - self._built >= self._age_s or now - self._moved[1] >= self.settled_s

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
        if not (self.due(state) or (idle and cheap)):
            return view
        task = self._start(state)
        if cheap:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.wait_s):
                    await asyncio.shield(task)
        return self.current or view

    async def follow(self, state: Callable[[], State]) -> None:
        """Keep the view following ``state()`` (the fold's, which a snapshot may
        replace), looked at every ``FOLLOW_S``."""
        while True:
            await asyncio.sleep(FOLLOW_S)
            if self.due(state()):
                await self.view(state())

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

    def _since(self, state: State) -> tuple[PoolView | None, set[ProxyKey]]:
        """The view to build the next from and the keys changed since it, or (None, ...)
        for a whole build: the first, or one under another state, trust or TTL."""
        basis = (state, state.trusted, state.settings.trust, state.settings.proxy_ttl_s)
        followed = state.view_changes is not None
        changed = state.take_view_changes()
        if self.current is None or not followed or basis != self._basis:
            self._basis = basis
            return None, set()
        if 3 * len(changed) > len(state.proxies):  # most rows: sorting anew is cheaper
            return None, set()
        return self.current, changed

    async def _build(self, state: State, waited: bool) -> PoolView:
        fg = None if waited else self.foreground
        rows = len(state.proxies)
        since, changed = self._since(state)
        built = building(state, now_ms(), self._through, since, changed)
        try:
            view, self._took = await drive(built, self.slice_s, self.clock, fg)
        except BaseException:
            self._basis = None  # the changes it took are lost: the next is whole
            raise
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


async def following(app: web.Application) -> AsyncIterator[None]:
    """The pool view follows the fold whether or not queries come (a view built on a
    query's call answered only the query after it)."""
    fold = app[FOLD]
    task = asyncio.create_task(app[POOL_VIEW].follow(lambda: fold.state), name="ppf-pool-view")
    yield
    await stop_tasks([task], 5)  # a bare cancel can be lost on 3.11 (projections/tasks.py)


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
