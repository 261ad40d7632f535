"""Query snapshots answer exactly what the plain read model answers, for any filter."""

from __future__ import annotations

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
