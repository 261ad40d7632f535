"""Hedged connects (endpoint/router/hedge.py), each rule on its own: upstreams whose
connects the test ends when it likes (a future each), so a slow one, a tarpit, a refusal
and a race are each exactly what the test says, on the real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from endpoint.link.upstream import Upstream
from endpoint.router.hedge import MIN_DELAY_S, Hedging, first_through


@dataclass
class Lab:
    """A pool of upstreams in order, and what became of each connect to them."""

    ups: list[Upstream]
    attempts: int = 3
    connect_s: float = 10.0
    hedging: Hedging = field(default_factory=lambda: Hedging(lambda _: None))
    counts: dict[str, int] = field(default_factory=dict)
    pending: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    blamed: list[tuple[str, str]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    _left: Iterator[Upstream] = field(init=False)

    def __post_init__(self) -> None:
        self._left = iter(self.ups)
        self.hedging.count = lambda what: self.counts.__setitem__(
            what, self.counts.get(what, 0) + 1
        )

    def pick(self) -> Upstream | None:
        return next(self._left, None)

    async def connect(self, up: Upstream) -> str:
        name = up.ip
        self.pending[name] = asyncio.get_running_loop().create_future()
        try:
            return await self.pending[name]
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise

    def failed(self, up: Upstream, exc: BaseException) -> None:
        self.blamed.append((up.ip, str(exc)))

    def close(self, link: str) -> None:
        self.closed.append(link)

    def start(self) -> asyncio.Task[tuple[Upstream, str] | None]:
        return asyncio.ensure_future(
            first_through(
                self.pick,
                self.connect,
                self.failed,
                self.close,
                attempts=self.attempts,
                connect_s=self.connect_s,
                hedging=self.hedging,
            )
        )

    def through(self, name: str) -> None:
        self.pending[name].set_result(f"link via {name}")

    def refuse(self, name: str) -> None:
        self.pending[name].set_exception(ConnectionRefusedError(f"{name} refused"))


def _ups(*names: str, latency_ms: float = 10.0) -> list[Upstream]:
    return [Upstream(name, 1080, "socks5", latency_ms=latency_ms) for name in names]


async def _raced(winner: str) -> Lab:
    """Upstream a slow, its hedge b started beside it, and ``winner`` through first: it
    carries the request; the other is still under way."""
    lab = Lab(_ups("a", "b"))
    task = lab.start()
    await asyncio.sleep(MIN_DELAY_S + 0.1)
    lab.through(winner)
    assert (await asyncio.wait_for(task, 1))[0].ip == winner
    return lab


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_connect_through_in_time_starts_no_hedge() -> None:
    """The first upstream's connect through before its delay carries the request: no
    second upstream is asked, nothing is counted or blamed."""
    lab = Lab(_ups("a", "b"))
    task = lab.start()
    await _turns()
    lab.through("a")
    up, link = await asyncio.wait_for(task, 1)
    assert (up.ip, link) == ("a", "link via a")
    await asyncio.sleep(MIN_DELAY_S + 0.05)  # past the delay: still no second
    assert list(lab.pending) == ["a"] and lab.counts == {} and lab.blamed == []


async def test_a_slow_connect_gets_a_hedge_and_the_first_through_carries_the_request() -> None:
    """Past its delay (0.25 s at least) a second upstream starts beside the first; the
    hedge through first carries the request, and the first, through later, is closed:
    counted as started and won, nobody blamed."""
    lab = Lab(_ups("a", "b", "c"))
    task = lab.start()
    await asyncio.sleep(MIN_DELAY_S / 2)
    assert list(lab.pending) == ["a"]
    await asyncio.sleep(MIN_DELAY_S)
    assert list(lab.pending) == ["a", "b"]  # one hedge, never a third beside them
    lab.through("b")
    up, link = await asyncio.wait_for(task, 1)
    assert (up.ip, link) == ("b", "link via b")
    lab.through("a")
    await _turns()
    assert lab.closed == ["link via a"] and lab.blamed == []
    assert lab.counts == {"hedge_started": 1, "hedge_won": 1}
    assert lab.hedging.in_flight == 0


async def test_a_tarpit_beaten_by_its_hedge_is_still_blamed_when_it_fails() -> None:
    """The first, beaten by the hedge, is left to run to its own end: when it fails (a
    tarpit's connect timeout), it is the proxy's failure all the same; and a hedge that
    loses to the first, through after all, is closed."""
    lab = await _raced(winner="b")
    lab.refuse("a")
    await _turns()
    assert lab.blamed == [("a", "a refused")]

    lost = await _raced(winner="a")
    lost.through("b")
    await _turns()
    assert lost.closed == ["link via b"] and lost.counts == {"hedge_started": 1, "hedge_lost": 1}


async def test_failures_go_on_to_the_next_until_the_attempts_run_out() -> None:
    """A connect that fails is blamed and the next upstream is tried, up to ``attempts``
    in all: then none (the caller says no proxy)."""
    lab = Lab(_ups("a", "b", "c", "d"), attempts=3)
    task = lab.start()
    for name in ("a", "b", "c"):
        await _turns()
        lab.refuse(name)
    assert await asyncio.wait_for(task, 1) is None
    assert [ip for ip, _ in lab.blamed] == ["a", "b", "c"] and "d" not in lab.pending

    empty = Lab([])
    assert await asyncio.wait_for(empty.start(), 1) is None


async def test_a_hedge_beside_a_failed_first_gets_its_own_delay() -> None:
    """The first fails while its hedge is under way: the hedge is waited for, and past
    its own delay a third upstream starts beside it (within ``attempts``)."""
    lab = Lab(_ups("a", "b", "c"), attempts=3)
    task = lab.start()
    await asyncio.sleep(MIN_DELAY_S + 0.05)
    assert list(lab.pending) == ["a", "b"]
    lab.refuse("a")
    await asyncio.sleep(MIN_DELAY_S / 2)
    assert list(lab.pending) == ["a", "b"]
    await asyncio.sleep(MIN_DELAY_S)
    assert list(lab.pending) == ["a", "b", "c"]
    lab.through("c")
    assert (await asyncio.wait_for(task, 1))[0].ip == "c"
    assert lab.counts == {"hedge_started": 2, "hedge_won": 1}


async def test_hedges_past_the_endpoints_bound_are_held_and_the_first_waited_for() -> None:
    """With ``max_in_flight`` hedges under way for the endpoint, a slow connect gets no
    hedge (counted as held) and is waited for; with hedging off (0), nothing is counted."""
    lab = Lab(_ups("a", "b"), hedging=Hedging(lambda _: None, max_in_flight=1, in_flight=1))
    task = lab.start()
    await asyncio.sleep(2 * MIN_DELAY_S)
    assert list(lab.pending) == ["a"] and lab.counts == {"hedge_held": 1}
    lab.through("a")
    assert (await asyncio.wait_for(task, 1))[0].ip == "a"

    off = Lab(_ups("a", "b"), hedging=Hedging(lambda _: None, max_in_flight=0))
    task = off.start()
    await asyncio.sleep(2 * MIN_DELAY_S)
    off.through("a")
    assert (await asyncio.wait_for(task, 1))[0].ip == "a"
    assert list(off.pending) == ["a"] and off.counts == {}


async def test_a_request_gone_cancels_its_connects_and_closes_one_through_anyway() -> None:
    """The waiting caller cancelled (the endpoint stopping, the client gone): its
    connects are cancelled, nobody is blamed, and a link that got through in the same
    turn, or whose outcome the caller was cancelled before reading, is closed, not left
    open."""
    lab = Lab(_ups("a", "b"))
    task = lab.start()
    await asyncio.sleep(MIN_DELAY_S + 0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _turns()
    assert sorted(lab.cancelled) == ["a", "b"] and lab.blamed == [] and lab.closed == []

    raced = Lab(_ups("a"))
    task = raced.start()
    await _turns()
    raced.through("a")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _turns()
    assert raced.closed == ["link via a"] and raced.blamed == []

    # Through, and its outcome handed to the waiter, which is cancelled before it reads it.
    late = Lab(_ups("a"))
    task = late.start()
    await _turns()
    late.through("a")
    await _turns(2)  # the connect ends, then its landing is read: the outcome is set
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _turns()
    assert late.closed == ["link via a"] and late.blamed == []
