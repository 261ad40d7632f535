"""The pool view answers exactly what the plain read model answers, for any filter."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.core import poolview
from projections.core.poolview import build
from projections.core.readmodels import ProxyFilter, query_proxies
from reducers import State, fold
from reducers.steps import at_once
from tests.helpers import worked

T0 = 1_800_000_000_000
PROTOS = ["http", "https", "socks4", "socks5"]
ANON = ["transparent", "anonymous", "elite"]


@st.composite
def pools(draw: st.DrawFn) -> State:
    state = State()
    n = draw(st.integers(1, 30))
    for seq in range(1, n + 1):
        p = draw(st.integers(0, 40))
        event = worked(
            f"8.8.{p // 200}.{p % 200 + 1}",
            1000 + p % 7,
            proto=draw(st.sampled_from(PROTOS)),
            latency_ms=draw(st.integers(0, 3000)),
            anonymity=draw(st.sampled_from(ANON)),
            mitm=draw(st.booleans()),
            https=draw(st.sampled_from(["yes", "no", ""])),
        )
        fold(state, event, seq, T0 + draw(st.integers(0, 40_000_000)))
    return state


filters = st.builds(
    ProxyFilter,
    proto=st.none() | st.sampled_from(PROTOS),
    anonymity=st.none() | st.sampled_from(ANON),
    max_latency_ms=st.none() | st.floats(0, 3000),
    status=st.sampled_from(["alive", "stale", "dead", "all"]),
    fresh_s=st.none() | st.integers(0, 50_000),
    mitm=st.none() | st.booleans(),
    https=st.none() | st.booleans(),
    country=st.none() | st.sampled_from([("",), ("BO",), ("", "BO")]),
)


@settings(max_examples=100, deadline=None)
@given(
    state=pools(),
    f=filters,
    sort=st.sampled_from(["latency", "last_seen"]),
    limit=st.integers(0, 30),
    later=st.integers(0, 100_000_000),
)
def test_the_pool_view_selects_what_the_read_model_answers(
    state: State, f: ProxyFilter, sort: str, limit: int, later: int
) -> None:
    """A query of the pool view answers exactly what the read model answers."""
    now = T0 + later
    expected = [(r.ip, r.port) for r in query_proxies(state, now, f, sort=sort, limit=limit)]
    got = [(v.ip, v.port) for v in build(state).select(f, now, sort=sort, limit=limit)]
    assert got == expected


async def test_a_pool_view_stays_fresh_ten_times_as_long_as_it_took_to_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's pool view is rebuilt when the fold moved and it is older than ten
    times its build took (at least 0.1 s, at most 30 s): a small pool's follows the fold
    within a tenth of a second, a pool that takes 2 s to build is kept 20 s, and its
    next build runs while the old one answers."""
    from gateway import views

    now = [100.0]
    build_s = [0.001]

    def slow_building(state: State, *args: Any) -> Any:
        now[0] += build_s[0]  # the build's own time passes on the keeper's clock
        return (yield from poolview.building(state, *args))

    monkeypatch.setattr(views, "building", slow_building)
    state = State()
    fold(state, worked("8.8.8.8"), 1, T0)
    keeper = views.PoolViewKeeper(clock=lambda: now[0], slice_s=10.0)
    first = await keeper.view(state)
    fold(state, worked("8.8.4.4"), 2, T0)
    now[0] += 0.05
    assert await keeper.view(state) is first  # 0.05 s old: fresh for 0.1 s
    now[0] += 0.06
    second = await keeper.view(state)
    assert second is not first and second.seq == 2
    build_s[0] = 2.0  # a big pool: the next build takes 2 s
    fold(state, worked("8.8.4.5"), 3, T0)
    now[0] += 0.2
    third = await keeper.view(state)  # the last build was cheap: waited for
    assert third.seq == 3
    fold(state, worked("8.8.4.6"), 4, T0)
    now[0] += 15.0
    assert await keeper.view(state) is third  # 15 s old, fresh for 20 s
    now[0] += 6.0
    assert await keeper.view(state) is third  # stale: rebuilt while it answers
    assert keeper._task is not None
    assert (await keeper._task).seq == 4
    fourth = await keeper.view(state)
    assert fourth.seq == 4
    now[0] += 100.0
    assert await keeper.view(state) is fourth  # not moved since: kept however old


def _big_pool(n: int, seed: int = 7) -> State:
    rng = random.Random(seed)
    state = State()
    for seq in range(1, n + 1):
        i = rng.randrange(4 * n)
        event = worked(
            f"45.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            1000 + i % 5,
            proto=rng.choice(PROTOS),
            latency_ms=rng.choice([50, 120, 800]),  # ties: ip and port decide the order
            anonymity=rng.choice(ANON),
        )
        fold(state, event, seq, T0 + rng.randrange(600_000))
    return state


def test_a_pool_view_built_in_steps_is_the_one_built_at_once() -> None:
    """Runs sorted a step each and merged give the very orders (and indexes) of one
    sort of the whole pool, ties included."""
    state = _big_pool(3 * poolview.STEP + 17)
    view = build(state)
    views = list(view.by_latency)
    assert list(view.by_latency) == sorted(views, key=lambda v: (v.latency, v.ip, v.port))
    assert list(view.by_last_seen) == sorted(views, key=lambda v: (-v.last_seen, v.ip, v.port))
    assert len(views) == len(state.proxies)
    for v in view.indexes["proto"]["socks5"]:
        assert "socks5" in v.protos
    elite = view.indexes["anonymity"]["elite"]
    assert tuple(elite) == tuple(v for v in views if v.anonymity == "elite")


def test_a_census_moved_with_the_ttls_edge_equals_one_counted_afresh() -> None:
    """As time moves on (and back), the running tally counts what a fresh view's
    first census counts at the same moment."""
    state = _big_pool(2_000)
    state.settings = msgspec.structs.replace(state.settings, proxy_ttl_s=300)
    moving = build(state)
    for later in (0, 200_000, 450_000, 610_000, 330_000, 900_000, 5_000):
        now = T0 + later
        assert moving.census(now) == build(state).census(now)
    assert moving.census(T0 + 900_000)["alive"] == 0 and build(state).census(T0)["alive"] > 0


async def test_a_big_pools_build_gives_the_loop_back_and_stats_do_not_wait_for_it() -> None:
    """While a pool of several steps is built, other coroutines run between its steps;
    /v1/stats and queries take the view there is rather than wait for a slow build."""
    from gateway import views

    state = _big_pool(4 * poolview.STEP)
    keeper = views.PoolViewKeeper(slice_s=0.0, wait_s=0.0)
    first = await keeper.view(state)
    keeper._took = 1.0  # as a big pool's build: stale rules, not the wait
    keeper._built -= 60.0
    fold(state, worked("8.8.8.8"), state.last_seq + 1, T0)
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(ticking())
    answered = await keeper.view(state, idle=True)
    assert answered is first  # the new one is not ready yet
    assert await keeper.view(state) is first  # nor for a query
    assert keeper._task is not None
    second = await keeper._task
    ticker.cancel()
    assert second.seq == state.last_seq and second is not first
    assert ticks > 20  # the loop ran others between the build's steps


def _orders(view: poolview.PoolView, now: int) -> tuple[Any, ...]:
    indexes = {k: {v: list(vs) for v, vs in index.items()} for k, index in view.indexes.items()}
    return (view.seq, list(view.by_latency), list(view.by_last_seen), indexes, view.census(now))


@settings(max_examples=60, deadline=None)
@given(state=pools(), data=st.data())
def test_a_view_built_from_the_rows_that_changed_is_the_whole_build(
    state: State, data: st.DataObject
) -> None:
    """A view built from the one before and the rows changed since (new, confirmed
    again, failed, evicted by the log's time, some cut by a checkpoint in between) has
    the very orders, indexes and census of a view built from the whole pool."""
    from events import ProxyFailed
    from projections.store import collect
    from tests.helpers import eid

    state.take_view_changes()  # a view follows the state from here
    before = build(state)
    seq = state.last_seq
    for _ in range(data.draw(st.integers(0, 25))):
        seq += 1
        p = data.draw(st.integers(0, 60))
        ip, port = f"8.8.{p // 200}.{p % 200 + 1}", 1000 + p % 7
        ts = T0 + data.draw(st.integers(0, 40_000_000)) + data.draw(st.sampled_from([0, 10**9]))
        if data.draw(st.booleans()):
            latency = data.draw(st.integers(0, 3000))
            fold(
                state,
                worked(ip, port, latency_ms=latency, proto=data.draw(st.sampled_from(PROTOS))),
                seq,
                ts,
            )
        else:
            fold(
                state,
                ProxyFailed(id=eid(), agent="w1", at=0, ip=ip, port=port, proto="http"),
                seq,
                ts,
            )
        if data.draw(st.integers(0, 9)) == 0:
            collect(state)  # a checkpoint's cut hands its keys on to the view
    changed = state.take_view_changes()
    now = T0 + data.draw(st.integers(0, 100_000_000))
    moved = at_once(poolview.building(state, now, None, before, changed))
    assert _orders(moved, now) == _orders(build(state), now)


async def test_a_view_is_due_once_the_fold_stands_still_and_waits_while_it_catches_up() -> None:
    """While the fold moves, a view is due after ten times its build; once the fold has
    stood still for ``settled_s``, at once (what it folded is served within a second);
    while the fold is far behind the log, only after ``max_age_s``."""
    from gateway import views

    now = [100.0]
    behind = [False]
    keeper = views.PoolViewKeeper(clock=lambda: now[0], slice_s=10.0, catching_up=lambda: behind[0])
    state = State()
    fold(state, worked("8.8.8.8"), 1, T0)
    await keeper.view(state)
    keeper._age_s = 5.0  # as a pool whose build took half a second
    fold(state, worked("8.8.4.4"), 2, T0)
    assert not keeper.due(state)  # it just moved: neither old enough nor still
    now[0] += 0.05
    assert not keeper.due(state)
    now[0] += 0.1  # the fold stood still 0.15 s
    assert keeper.due(state)
    behind[0] = True  # far behind the log: the view waits for its max age
    assert not keeper.due(state)
    now[0] += keeper.max_age_s
    assert keeper.due(state)


async def test_the_pool_view_is_wanted_while_built_or_due_and_not_once_it_holds_the_fold() -> None:
    """``wanted`` (what a timed checkpoint waits for): true while a build is under way
    and while one is due, false once the view holds what the fold applied, and before
    any view was asked for."""
    from gateway import views

    now = [100.0]
    state = _big_pool(4 * poolview.STEP)
    keeper = views.PoolViewKeeper(clock=lambda: now[0], slice_s=0.0, wait_s=0.0)
    assert not keeper.wanted(state)  # nobody asked for a view yet
    await keeper.view(state)
    assert not keeper.wanted(state)  # it holds the fold's sequence
    keeper._took, keeper._age_s = 1.0, 60.0  # as a big pool's: built while the old answers
    fold(state, worked("8.8.8.8"), state.last_seq + 1, T0)
    assert not keeper.wanted(state)  # the fold just moved: not due yet
    now[0] += 0.2  # the fold stood still past settled_s
    assert keeper.wanted(state)
    await keeper.view(state, idle=True)
    assert keeper._task is not None and not keeper._task.done()
    fold(state, worked("8.8.4.4"), state.last_seq + 1, T0)
    assert not keeper.due(state)  # the fold moved again: wanted for the build alone
    assert keeper.wanted(state)
    await keeper._task
    assert not keeper.wanted(state)  # built, and not due: the fold just moved
