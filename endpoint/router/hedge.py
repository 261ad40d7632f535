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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Generic, TypeVar

from endpoint.link.upstream import Upstream

__all__ = ["Hedged", "Hedging", "delay_s", "first_through"]

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


class Hedged(Generic[T]):
    """One request's connects, driven from their tasks' callbacks and a timer: no task
    of its own and no ``asyncio.wait`` a connect (a link a request, through a site that
    closes each answer, opens one for every request; its task and wait were 32 µs of
    such a request's 388, docs/decisions.md, The endpoint). ``pick`` gives the next
    upstream to try (None: no more), ``connect`` connects within the connect timeout,
    ``failed`` hears each attempt that failed, ``close`` closes a connection not used;
    at most ``attempts`` upstreams in all. ``then`` hears the first upstream through and
    its connection, or None when none got through, once, unless ``cancel`` came first.
    ``spawn`` runs each connect as a task its owner keeps (and cancels at its end)."""

    def __init__(
        self,
        pick: Callable[[], Upstream | None],
        connect: Callable[[Upstream], Coroutine[object, object, T]],
        failed: Callable[[Upstream, BaseException], None],
        close: Callable[[T], None],
        then: Callable[[tuple[Upstream, T] | None], None],
        *,
        attempts: int,
        connect_s: float,
        hedging: Hedging,
        spawn: Callable[[Coroutine[object, object, T]], asyncio.Task[T]] = asyncio.ensure_future,
    ) -> None:
        self.pick, self.connect, self.failed, self.close = pick, connect, failed, close
        self.then, self.spawn = then, spawn
        self.attempts, self.connect_s, self.hedging = attempts, connect_s, hedging
        self.running: dict[asyncio.Task[T], Upstream] = {}
        self.hedges: set[asyncio.Task[T]] = set()
        self.tried = 0
        self.alone = False  # no hedge could start beside the one under way: it is waited for
        self.decided = False  # ended with a winner or none, or cancelled
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The first attempt (or none, when there is no upstream to try)."""
        up = self.pick() if self.tried < self.attempts else None
        if up is None:
            self._decide(None)
            return
        self._launch(up)
        self.alone = False
        self._arm()

    def cancel(self) -> None:
        """The request is gone: its connects cancelled, and closed should one get
        through all the same; ``then`` is not called."""
        if self.decided:
            return
        self.decided = True
        self._disarm()
        for task in self.running:
            task.cancel()
            task.add_done_callback(functools.partial(_close_quietly, close=self.close))
        self.running.clear()

    def _launch(self, up: Upstream) -> asyncio.Task[T]:
        task = self.spawn(self.connect(up))
        self.running[task] = up
        self.tried += 1
        task.add_done_callback(self._landed)
        return task

    def _arm(self) -> None:
        """The one under way is waited for alone its delay: then a hedge beside it."""
        self._disarm()
        if len(self.running) == 1 and self.tried < self.attempts and not self.alone:
            wait = delay_s(next(iter(self.running.values())), self.connect_s)
            self.timer = asyncio.get_running_loop().call_later(wait, self._slow)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _slow(self) -> None:
        """The one under way is slow: a second beside it, within the endpoint's bound."""
        self.timer = None
        if self.decided:
            return
        if self.hedging.may() and (up := self.pick()) is not None:
            hedge = self._launch(up)
            self.hedges.add(hedge)
            self.hedging.in_flight += 1
            self.hedging.count("hedge_started")
            hedge.add_done_callback(functools.partial(_hedge_ended, self.hedging))
        else:
            self.alone = True

    def _landed(self, task: asyncio.Task[T]) -> None:
        up = self.running.pop(task, None)
        if up is None or self.decided:
            return  # let go by ``cancel``, or a slower one ``_decide`` settles
        if task.cancelled():  # its owner's end (the endpoint stopping): nothing goes on
            self.cancel()
            return
        exc = task.exception()
        if exc is not None:
            self.failed(up, exc)
            if self.running:
                self._arm()  # the one left is waited for its own delay
            else:
                self.start()  # the next upstream, while attempts are left
            return
        if self.hedges:
            self.hedging.count("hedge_won" if task in self.hedges else "hedge_lost")
        self._decide((up, task.result()))

    def _decide(self, through: tuple[Upstream, T] | None) -> None:
        self.decided = True
        self._disarm()
        for slower, up in self.running.items():
            # Run to its own timeout: one that never gets through (a tarpit) is the
            # proxy's failure all the same, though a hedge carried the request, and one
            # that does is closed.
            slower.add_done_callback(
                functools.partial(_settle, up=up, failed=self.failed, close=self.close)
            )
        self.running.clear()
        self.then(through)


async def first_through(
    pick: Callable[[], Upstream | None],
    connect: Callable[[Upstream], Coroutine[object, object, T]],
    failed: Callable[[Upstream, BaseException], None],
    close: Callable[[T], None],
    *,
    attempts: int,
    connect_s: float,
    hedging: Hedging,
) -> tuple[Upstream, T] | None:
    """``Hedged``'s outcome, awaited (a tunnel's opening, which goes on in its task);
    its connects cancelled when the wait is."""
    outcome: asyncio.Future[tuple[Upstream, T] | None] = asyncio.get_running_loop().create_future()

    def then(through: tuple[Upstream, T] | None) -> None:
        if not outcome.cancelled():
            outcome.set_result(through)
        elif through is not None:  # through in the turn the wait was cancelled in
            _close_quietly_now(through[1], close)

    hedged = Hedged(
        pick, connect, failed, close, then,
        attempts=attempts, connect_s=connect_s, hedging=hedging,
    )  # fmt: skip
    hedged.start()
    try:
        return await outcome
    except asyncio.CancelledError:
        hedged.cancel()
        if outcome.done() and not outcome.cancelled() and (through := outcome.result()):
            _close_quietly_now(through[1], close)  # through, but the wait was cancelled first
        raise


def _hedge_ended(hedging: Hedging, _: object) -> None:
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
    _close_quietly(task, close=close)


def _close_quietly(task: asyncio.Future[T], *, close: Callable[[T], None]) -> None:
    if not task.cancelled() and task.exception() is None:
        _close_quietly_now(task.result(), close)


def _close_quietly_now(connection: T, close: Callable[[T], None]) -> None:
    with contextlib.suppress(Exception):
        close(connection)
