"""The pool's composition, kept by deltas as the fold applies events, equals a scan of
the rows at any time, and is rebuilt the same on restore."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from events import Located, ProxyFailed
from reducers import State, fold
from reducers.indexes import reindex
from reducers.pool import BUCKET_MS, band_edges
from tests.helpers import eid, worked

T0 = 1_800_000_000_000


def _scanned(state: State, now: int) -> dict[str, dict[tuple[str, str, str], int]]:
    """The same counts from the rows, by the bucket rule the composition documents."""
    alive_from, stale_from = band_edges(now, state.settings.proxy_ttl_s)
    out: dict[str, dict[tuple[str, str, str], int]] = {"alive": {}, "stale": {}, "dead": {}}
    for row in state.proxies.values():
        newest = row.last_seen // BUCKET_MS * BUCKET_MS + BUCKET_MS - 1
        band = "alive" if newest >= alive_from else "stale" if newest >= stale_from else "dead"
        key = (row.proto, row.anonymity, row.country)
        out[band][key] = out[band].get(key, 0) + 1
    return out


steps = st.lists(
    st.tuples(
        st.sampled_from(["worked", "failed", "located"]),
        st.integers(0, 30),  # which proxy
        st.integers(0, 6 * 3600 * 1000),  # how far the log's time moves
        st.sampled_from(["http", "socks5"]),
        st.sampled_from(["", "elite", "anonymous"]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, later=st.integers(0, 20 * 3600 * 1000))
def test_composition_equals_a_scan_and_survives_a_restore(
    steps: list[tuple[str, int, int, str, str]], later: int
) -> None:
    """Confirmations, failures, locations and sweeps move the counts exactly as a scan
    of the rows would count them; a state rebuilt from its rows counts the same."""
    state = State()
    ts = T0
    for seq, (kind, p, dt, proto, anonymity) in enumerate(steps, 1):
        ts += dt
        ip = f"8.8.{p // 10}.{p % 10 + 1}"
        if kind == "worked":
            event = worked(ip, 8080 + p % 2, proto=proto, anonymity=anonymity)
        elif kind == "failed":
            event = ProxyFailed(id=eid(), agent="c1", at=0, ip=ip, port=8080, proto=proto)
        else:
            event = Located(id=eid(), agent="fold", at=0, ip=ip, country="DE", geo="t")
        fold(state, event, seq, ts)
    now = ts + later
    assert state.composition.bands(now, state.settings.proxy_ttl_s) == _scanned(state, now)
    reindex(state)
    assert state.composition.bands(now, state.settings.proxy_ttl_s) == _scanned(state, now)
