"""Work that shares the fold's event loop and goes first: the requests being answered.

The fold gives the loop back after every slice of about ``SLICE_S``, but one request
takes several rounds of the loop (its read, its handler's steps, a publish and its ack,
its write), and every round let one more slice in: at 4 ms a slice, a request of eight
rounds waited 32 ms for the fold in a backlog. So between slices the fold (and any
stepped work driven by ``drive``) waits while a request is
in flight, for at most ``at_most_s``: however busy the API, the fold keeps its share of
the loop, and a request mostly meets no slice at all.

Between two steps is also where the process's collector policy runs (``between``: the
serving commands pass ``ops/collector.py``'s young collection), so what a step made
young is walked before the next step adds to it: a pool view's build's steps make tracked
tuples but few allocations, and left to the collector's own count, a young collection
came after hundreds of them and walked them all at once (10-16 ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["Foreground", "drive", "give_way"]

# Rounds of the loop given before looking: a request whose bytes came during the slice
# is read in the first, its handler's first step (which counts it in flight) runs in
# the second, after the yielder's own wake-up; so by the third it is counted. With one
# round, two more slices ran before every request's handler began.
ROUNDS = 3
T = TypeVar("T")


class Foreground:
    """How many requests are in flight on this loop; background work yields to them."""

    def __init__(self, between: Callable[[], None] = lambda: None) -> None:
        self.between = between  # run whenever background work yields (above)
        self.active = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around one request's handling (the gateway's middleware)."""
        self.active += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self._quiet.set()

    async def yield_to(self, at_most_s: float) -> None:
        """Run ``between``, give the loop back for ``ROUNDS`` rounds; then, while a
        request is in flight, until none is or ``at_most_s`` has passed."""
        self.between()
        for _ in range(ROUNDS):
            await asyncio.sleep(0)
        if not self.active:
            return
        try:
            async with asyncio.timeout(at_most_s):
                await self._quiet.wait()
        except TimeoutError:
            pass


async def give_way(foreground: Foreground | None, at_most_s: float) -> None:
    """Between two steps of background work: ``foreground.yield_to`` when there is a
    foreground to yield to, else one round of the loop."""
    if foreground is None:
        await asyncio.sleep(0)
    else:
        await foreground.yield_to(at_most_s)


async def drive(
    steps: Generator[None, None, T],
    slice_s: float,
    clock: Callable[[], float] = time.monotonic,
    foreground: Foreground | None = None,
) -> tuple[T, float]:
    """Every step, giving the loop back every ``slice_s`` of ``clock`` (to the requests in
    flight in ``foreground``, when given); the generator's value and the loop's time the
    steps took (their slices summed)."""
    took, mark = 0.0, clock()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, took + clock() - mark
        if clock() - mark >= slice_s:
            took += clock() - mark
            await give_way(foreground, slice_s)
            mark = clock()
