"""Determinism: however the fold is interrupted and restored, the digest is the same.

Hypothesis draws event sequences over a small world (few proxies, sources, targets,
agents, so rules interact) and crash points; each run checkpoints to DuckDB at random
points, "crashes" (drops the in-memory state and the uncheckpointed tail), restores
from the file and folds on from ``last_seq + 1`` with redeliveries, like the live fold.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events as ev
from projections import Folder, Store, digest
from projections.store import collect
from reducers import State
from reducers.fold import PIECE
from tests.helpers import message

T0 = 1_800_000_000_000
IPS = ["8.8.8.8", "1.1.1.1", "9.9.9.9", "10.0.0.1", "127.0.0.1", "999.1.1.1"]
TARGETS = ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "s001"]
AGENTS = ["w1", "w2", "c1"]
URLS = ["http://a.example/1", "http://b.example/2"]

_n = st.integers(min_value=0, max_value=10**6)


def _id(draw: st.DrawFn) -> str:
    return f"00000000-0000-7000-8000-{draw(_n):012d}"


@st.composite
def events(draw: st.DrawFn) -> ev.Event:
    agent = draw(st.sampled_from(AGENTS))
    lease = f"00000000-0000-7000-9000-{draw(st.integers(0, 5)):012d}"
    target = draw(st.sampled_from(TARGETS))
    url = draw(st.sampled_from(URLS))
    kind = draw(st.integers(0, 12))
    base = {"id": _id(draw), "agent": agent, "at": 0}
    if kind == 0:
        return ev.Leased(
            **base,
            lease=lease,
            kind="source",
            target=target,
            ttl_s=draw(st.sampled_from([10, 30, 60])),
        )
    if kind == 1:
        return ev.Released(
            **base,
            lease=lease,
            target=target,
            outcome=draw(st.sampled_from(["done", "failed", "abandoned"])),
            counted=draw(st.booleans()),
        )
    if kind == 2:
        return ev.Heartbeat(**base, leases=[lease])
    if kind == 3:
        return ev.Fetched(
            **base,
            url_id=ev.url_id(url),
            lease=lease,
            ok=draw(st.booleans()),
            changed=draw(st.booleans()),
            content_hash=str(draw(_n)),
            fetch_ms=draw(st.integers(0, 9999)),
        )
    if kind == 4:
        return ev.Extracted(
            **base, url_id=ev.url_id(url), count=draw(st.integers(0, 500)), lease=lease
        )
    if kind == 5:
        return ev.SourceAdded(**base, url=url, url_id=ev.url_id(url))
    if kind == 6:
        return ev.ProxyFailed(**base, ip=draw(st.sampled_from(IPS)), port=8080, proto="http")
    if kind == 7:
        return ev.Configured(
            **base,
            settings=ev.Settings(
                lab=draw(st.booleans()), proxy_ttl_s=draw(st.sampled_from([60, 600]))
            ),
        )
    if kind == 8:
        return ev.LeaseReset(**base, target=target)
    if kind == 12:  # a checker's round: long enough to be folded in pieces (PIECE)
        result = st.builds(
            ev.CheckResult,
            ip=st.sampled_from(IPS),
            port=st.sampled_from([8080, 3128]),
            proto=st.sampled_from(["http", "socks5"]),
            ok=st.booleans(),
            latency_ms=st.integers(0, 5000),
        )
        results = draw(st.lists(result, max_size=3 * PIECE))
        return ev.ProxiesChecked(**base, key="s001", results=results, lease=lease)
    return ev.ProxyWorked(
        **base,
        ip=draw(st.sampled_from(IPS)),
        port=draw(st.sampled_from([8080, 3128, 0])),
        proto=draw(st.sampled_from(["http", "socks5"])),
        latency_ms=draw(st.integers(0, 5000)),
        source=ev.url_id(url),
        lease=lease,
        anonymity=draw(st.sampled_from(["", "elite"])),
    )


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[int, int, bytes, bytes]]:
    """A log: events at non-decreasing server times (sometimes hours apart), some garbage."""
    items = draw(st.lists(st.one_of(events(), st.just(None)), min_size=1, max_size=60))
    if draw(st.booleans()):
        # Per-agent subjects switched on somewhere: agents' high-water marks then drop
        # re-sends, and must survive checkpoints and crashes like everything else.
        switch = ev.Configured(
            id=_id(draw), agent="admin", at=0, settings=ev.Settings(agent_subjects=True)
        )
        items.insert(draw(st.integers(0, len(items))), switch)
    ts = T0
    out = []
    for seq, event in enumerate(items, start=1):
        ts += draw(st.sampled_from([0, 1, 5_000, 70_000, 3_600_000]))
        if event is None:
            out.append((seq, ts, b"ppf.proxy.x", b'{"type": "Bogus"}'))
        else:
            out.append(message(seq, ts, event))
    return out


def _fold_all(msgs: list[tuple[int, int, bytes, bytes]]) -> State:
    state = State()
    Folder(state).apply(msgs)
    return state


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(msgs=logs(), cuts=st.lists(st.integers(0, 60), max_size=4), crashes=st.data())
def test_crash_restore_resume_equals_one_fold(
    tmp_path_factory: pytest.TempPathFactory,
    msgs: list[tuple[int, int, bytes, bytes]],
    cuts: list[int],
    crashes: st.DataObject,
) -> None:
    """Checkpoints and crashes anywhere give the digest of one uninterrupted fold."""
    expected = digest(_fold_all(msgs))
    db = tmp_path_factory.mktemp("crash") / "p.duckdb"
    store = Store(db)
    state = State()
    folder = Folder(state)
    pos = 0
    for cut in sorted(set(min(c, len(msgs)) for c in cuts)):
        folder.apply(msgs[pos:cut])
        store.write(collect(state))
        pos = cut
        # Fold a little further, then crash before the next checkpoint.
        lost = crashes.draw(st.integers(0, 5))
        folder.apply(msgs[pos : pos + lost])
        store.close()
        store = Store(db)
        state = store.restore()
        folder = Folder(state)
        # The reader resumes at last_seq + 1, but also receives a few redeliveries.
        pos = max(0, state.last_seq - crashes.draw(st.integers(0, 3)))
    folder.apply(msgs[pos:])
    assert digest(state) == expected
    store.write(collect(state))
    restored = store.restore()
    store.close()
    assert digest(restored) == expected


@settings(max_examples=40, deadline=None)
@given(msgs=logs())
def test_memory_and_duckdb_build_identical_projections(msgs: list) -> None:  # type: ignore[type-arg]
    """Contract: the DuckDB round trip is exact, row for row."""
    state = _fold_all(msgs)
    store = Store(":memory:")
    store.write(collect(state))
    restored = store.restore()
    store.close()
    assert restored.proxies == state.proxies
    assert restored.sources == state.sources
    assert restored.leases == state.leases
    assert restored.agents == state.agents
    assert restored.settings == state.settings
    assert restored.high_water == state.high_water
    assert digest(restored) == digest(state)


@settings(max_examples=40, deadline=None)
@given(msgs=logs())
def test_fold_twice_and_redeliver_everything(msgs: list) -> None:  # type: ignore[type-arg]
    """Folding the same log twice, or every message twice, gives one digest."""
    once = _fold_all(msgs)
    twice = State()
    folder = Folder(twice)
    for m in msgs:
        folder.apply([m, m])
    folder.apply(msgs)
    assert digest(twice) == digest(once)
    assert digest(_fold_all(msgs)) == digest(once)


@settings(max_examples=30, deadline=None)
@given(msgs=logs())
def test_a_fold_in_time_slices_equals_one_fold(msgs: list) -> None:  # type: ignore[type-arg]
    """The live fold's slices (Folder.apply_for, bounded by time): with no time at all
    each slice still folds one message or one piece of a round, a round in pieces stays
    at the sequence before it until it is whole, and the slices together build what
    one fold builds."""
    once = _fold_all(msgs)
    sliced = State()
    folder = Folder(sliced)
    i, calls = 0, 0
    while i < len(msgs):
        before = sliced.last_seq
        nxt = folder.apply_for(msgs, i, 0.0)
        if folder.midway:
            assert nxt == i and sliced.last_seq == before
        else:
            assert nxt == i + 1
        i, calls = nxt, calls + 1
    assert calls >= len(msgs)
    assert digest(sliced) == digest(once)


def test_digest_sees_a_change() -> None:
    """The digest is not constant: one different latency changes it."""
    from tests.helpers import worked

    a = _fold_all([message(1, T0, worked(latency_ms=1))])
    b = _fold_all([message(1, T0, worked(latency_ms=2))])
    assert digest(a) != digest(b)


def test_store_refuses_another_schema(tmp_path: Path) -> None:
    """A DuckDB file of another schema version is refused, not misread."""
    from projections import StoreError

    store = Store(tmp_path / "x.duckdb")
    state = State()
    cp = collect(state)
    cp.meta["schema"] = "999"
    store.write(cp)
    store.close()
    with pytest.raises(StoreError, match="schema 999"):
        Store(tmp_path / "x.duckdb")
