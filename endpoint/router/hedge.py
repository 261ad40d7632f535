"""Hedged connects: a second upstream started beside a first that is slow to connect.

A connect (for SOCKS and CONNECT, its handshake too) that has not finished within a
delay derived from that upstream's own latency (``delay_s``: three times what its checks
took, within [0.25 s, half the connect timeout]) starts the next upstream beside it;
whichever is through first carries the request and the other is closed once through, or
blamed as the proxy's failure when it is not within the connect timeout (a tarpit a hedge
always beat would otherwise never be reported). Nothing has
been sent upstream by then, so nothing is sent twice. A hanging upstream then costs a
request its delay, not the whole connect timeout. Bounded: at most two under way for one
request, and at most ``max_in_flight`` hedges at once for the endpoint (a pool gone slow
all at once must not double its connects). Counted in the endpoint's outcomes
(``/metrics``): ``hedge_started``, ``hedge_won`` (the hedge was through first),
``hedge_lost`` (the first was, after all), ``hedge_held`` (not started: the bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from endpoint.link.upstream import Upstream

__all__ = ["Hedging", "delay_s", "first_through"]

T = TypeVar("T")

FACTOR = 3.0  # past this many times its usual latency, a connect is hanging, not slow
MIN_DELAY_S = 0.25
UNKNOWN_S = 1.0  # the delay for an upstream whose latency nobody measured


def delay_s(up: Upstream, connect_s: float) -> float:
    """How long ``up``'s connect is waited for alone before a second upstream starts."""
    base = FACTOR * up.latency_ms / 1000 if up.latency_ms > 0 else UNKNOWN_S
    return min(max(base, MIN_DELAY_S), connect_s / 2)


@dataclass
class Hedging:
    """The endpoint's hedges under way, within ``max_in_flight``; 0 turns hedging off.
    ``count``: the endpoint's outcomes' (endpoint/router/outcomes.py)."""

    count: Callable[[str], None]
    max_in_flight: int = 64
    in_flight: int = 0

    def may(self) -> bool:
        if self.in_flight < self.max_in_flight:
            return True
        if self.max_in_flight:
            self.count("hedge_held")
        return False


async def first_through(
    pick: Callable[[], Upstream | None],
    connect: Callable[[Upstream], Awaitable[T]],
    failed: Callable[[Upstream, BaseException], None],
    close: Callable[[T], None],
    *,
    attempts: int,
    connect_s: float,
    hedging: Hedging,
) -> tuple[Upstream, T] | None:
    """The first upstream through, and its connection: ``pick`` gives the next one to try
    (None: no more), ``connect`` connects within the connect timeout, ``failed`` hears
    each attempt that failed; at most ``attempts`` upstreams in all. None when none got
    through."""
    running: dict[asyncio.Future[T], Upstream] = {}
    hedges: set[asyncio.Future[T]] = set()
    tried = 0
    alone = False  # no hedge could start beside the one under way: it is waited for
    decided = False  # ended with a winner or none, not cancelled
    try:
        while True:
            if not running:
                up = pick() if tried < attempts else None
                if up is None:
                    decided = True
                    return None
                running[asyncio.ensure_future(connect(up))] = up
                tried += 1
                alone = False
            wait = None
            if len(running) == 1 and tried < attempts and not alone:
                wait = delay_s(next(iter(running.values())), connect_s)
            done, _ = await asyncio.wait(running, timeout=wait, return_when="FIRST_COMPLETED")
            if not done:  # the one under way is slow: a second beside it
                if hedging.may() and (up := pick()) is not None:
                    hedge = asyncio.ensure_future(connect(up))
                    running[hedge] = up
                    hedges.add(hedge)
                    hedging.in_flight += 1
                    hedging.count("hedge_started")
                    tried += 1
                    hedge.add_done_callback(lambda _: _landed(hedging))
                else:
                    alone = True
                continue
            for landed in done:
                up = running.pop(landed)
                exc = landed.exception()
                if exc is not None:
                    failed(up, exc)
                    continue
                if hedges:
                    hedging.count("hedge_won" if landed in hedges else "hedge_lost")
                decided = True
                return up, landed.result()
    finally:
        for slower, up in running.items():
            if decided:
                # Run to its own timeout: one that never gets through (a tarpit) is the
                # proxy's failure all the same, though a hedge carried the request, and
                # one that does is closed.
                slower.add_done_callback(
                    functools.partial(_settle, up=up, failed=failed, close=close)
                )
            else:  # the request is gone: closed if it got through after all
                slower.cancel()
                slower.add_done_callback(lambda t: _close_quietly(t, close))


def _landed(hedging: Hedging) -> None:
    hedging.in_flight -= 1


def _settle(
    task: asyncio.Future[T],
    *,
    up: Upstream,
    failed: Callable[[Upstream, BaseException], None],
    close: Callable[[T], None],
) -> None:
    """A connect left behind by the winner, ended: blamed when it failed, else closed."""
    if task.cancelled():
        return
    if (exc := task.exception()) is not None:
        with contextlib.suppress(Exception):
            failed(up, exc)
        return
    _close_quietly(task, close)


def _close_quietly(task: asyncio.Future[T], close: Callable[[T], None]) -> None:
    if not task.cancelled() and task.exception() is None:
        with contextlib.suppress(Exception):
            close(task.result())
