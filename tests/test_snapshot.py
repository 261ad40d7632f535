"""Query snapshots answer exactly what the plain read model answers, for any filter."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.readmodels import ProxyFilter, query_proxies
from projections.snapshot import build
from reducers import State, fold
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
def test_snapshot_select_equals_the_read_model(
    state: State, f: ProxyFilter, sort: str, limit: int, later: int
) -> None:
    """A snapshot query answers exactly what the read model answers."""
    now = T0 + later
    expected = [(r.ip, r.port) for r in query_proxies(state, now, f, sort=sort, limit=limit)]
    got = [(v.ip, v.port) for v in build(state).select(f, now, sort=sort, limit=limit)]
    assert got == expected


def test_a_snapshot_stays_fresh_ten_times_as_long_as_it_took_to_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's snapshot is rebuilt when the fold moved and it is older than ten
    times its build took (at least 0.1 s, at most 30 s): a small pool's follows the fold
    within a tenth of a second, a pool that takes 2 s to build is kept 20 s."""
    from gateway import queries

    now = [100.0]
    build_s = [0.001]

    def slow_build(state: State) -> Any:
        now[0] += build_s[0]  # the build's own time passes on the keeper's clock
        return build(state)

    monkeypatch.setattr(queries, "build", slow_build)
    state = State()
    fold(state, worked("8.8.8.8"), 1, T0)
    keeper = queries.SnapshotKeeper(clock=lambda: now[0])
    first = keeper.snapshot(state)
    fold(state, worked("8.8.4.4"), 2, T0)
    now[0] += 0.05
    assert keeper.snapshot(state) is first  # 0.05 s old: fresh for 0.1 s
    now[0] += 0.06
    second = keeper.snapshot(state)
    assert second is not first and second.seq == 2
    build_s[0] = 2.0  # a big pool: the next build takes 2 s
    fold(state, worked("8.8.4.5"), 3, T0)
    now[0] += 0.2
    third = keeper.snapshot(state)
    assert third.seq == 3
    fold(state, worked("8.8.4.6"), 4, T0)
    now[0] += 15.0
    assert keeper.snapshot(state) is third  # 15 s old, fresh for 20 s
    now[0] += 6.0
    assert keeper.snapshot(state).seq == 4
    fourth = keeper.snapshot(state)
    now[0] += 100.0
    assert keeper.snapshot(state) is fourth  # not moved since: kept however old
