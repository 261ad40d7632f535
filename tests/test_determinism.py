"""Determinism: however the fold is interrupted and restored, the digest is the same.

Hypothesis draws event sequences over a small world (few proxies, sources, targets,
agents, so rules interact) and crash points; each run checkpoints to DuckDB at random
points, "crashes" (drops the in-memory state and the uncheckpointed tail), restores
from the file and folds on from ``last_seq + 1`` with redeliveries, like the live fold.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events as ev
import projections.folder
from events.ids import uuid7
from events.sites import SiteRule
from projections import Folder, Store, digest
from projections.store import collect
from reducers import State
from reducers.fold import PIECE, folding
from reducers.steps import at_once
from tests.helpers import message

T0 = 1_800_000_000_000
IPS = ["8.8.8.8", "1.1.1.1", "9.9.9.9", "10.0.0.1", "127.0.0.1", "999.1.1.1", "2001:db8::1"]
TARGETS = ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "s001", "8-8-8-8_8080"]
AGENTS = ["w1", "w2", "c1", "s1", "shop"]
ROLES: dict[str, ev.Role] = {
    "w1": "worker", "w2": "worker", "c1": "checker", "s1": "seed", "shop": "consumer"
}  # fmt: skip
URLS = ["http://a.example/1", "http://b.example/2"]
SITES = ["google.com", "shop.example", "203.0.113.7", "bad..site"]
KEYS = ["pages/aaaaaaaaaaaaaaaa/1", "seed/p1/r1"]

_n = st.integers(min_value=0, max_value=10**6)


def _id(draw: st.DrawFn) -> str:
    """A UUIDv7 near the log's time (an hour either way): ids the re-send windows and
    the guarded skew rule take, and some they refuse."""
    ms = T0 + draw(st.integers(-3_600_000, 3_600_000))
    return uuid7(ms, draw(_n).to_bytes(10, "big"))


def _settings(draw: st.DrawFn) -> ev.Settings:
    """Settings as logs have had them: from none of the later rules to all of them."""
    return ev.Settings(
        lab=draw(st.booleans()),
        proxy_ttl_s=draw(st.sampled_from([60, 600, 14_400])),
        agent_subjects=draw(st.booleans()),
        trust=draw(st.booleans()),
        trusted_agents=tuple(draw(st.lists(st.sampled_from(AGENTS), max_size=2, unique=True))),
        spot_window_s=draw(st.sampled_from([0, 1_800])),
        trust_after=draw(st.sampled_from([1, 10])),
        quota_events_per_min=draw(st.sampled_from([0, 3, 3_000])),
        report_budget_per_hour=draw(st.sampled_from([1, 100])),
        resend_window=draw(st.sampled_from([0, 4, 512])),
        resend_window_s=draw(st.sampled_from([0, 60, 3_900])),
        batches=draw(st.booleans()),
        guarded=draw(st.booleans()),
        address_rule=draw(st.sampled_from([0, 1])),
        recheck_fresh_s=draw(st.sampled_from([0, 900])),
    )


def _result(draw: st.DrawFn) -> ev.CheckResult:
    return ev.CheckResult(
        ip=draw(st.sampled_from(IPS)),
        port=draw(st.sampled_from([8080, 3128])),
        proto=draw(st.sampled_from(["http", "socks5"])),
        ok=draw(st.booleans()),
        latency_ms=draw(st.integers(0, 5000)),
    )


def _builders(draw: st.DrawFn) -> dict[type[ev.Event], Callable[[], ev.Event]]:
    """One way to make each event type (``test_the_property_draws_every_event_type``
    holds it to every one the catalogue has)."""
    agent = draw(st.sampled_from(AGENTS))
    lease = f"00000000-0000-7000-9000-{draw(st.integers(0, 5)):012d}"
    target = draw(st.sampled_from(TARGETS))
    kind = draw(st.sampled_from(LEASE_KINDS))
    url = draw(st.sampled_from(URLS))
    key = draw(st.sampled_from(KEYS))
    ip = draw(st.sampled_from(IPS))
    base = {"id": _id(draw), "agent": agent, "at": 0}
    return {
        ev.Leased: lambda: ev.Leased(
            **base, lease=lease, kind=kind, target=target,
            ttl_s=draw(st.sampled_from([10, 30, 60])),
            checkout=draw(st.sampled_from(["", "co1"])) if kind == "proxy" else "",
        ),
        ev.Released: lambda: ev.Released(
            **base, lease=lease, target=target, kind=kind,
            outcome=draw(st.sampled_from(["done", "failed", "abandoned"])),
            counted=draw(st.booleans()),
        ),
        ev.Heartbeat: lambda: ev.Heartbeat(
            **base, leases=[lease], outage=draw(st.sampled_from(["", "no route"]))
        ),
        ev.LeaseReset: lambda: ev.LeaseReset(**base, target=target, kind=kind),
        ev.Fetched: lambda: ev.Fetched(
            **base, url_id=ev.url_id(url), lease=lease, ok=draw(st.booleans()),
            changed=draw(st.booleans()), content_hash=str(draw(_n)),
            fetch_ms=draw(st.integers(0, 9999)),
        ),
        ev.Extracted: lambda: ev.Extracted(
            **base, url_id=ev.url_id(url), count=draw(st.integers(0, 500)), lease=lease
        ),
        ev.SourceAdded: lambda: ev.SourceAdded(**base, url=url, url_id=ev.url_id(url)),
        ev.Discovered: lambda: ev.Discovered(
            **base, parent=ev.url_id(url), urls=draw(st.lists(st.sampled_from(URLS), max_size=2))
        ),
        ev.ProxyWorked: lambda: ev.ProxyWorked(
            **base, ip=ip, port=draw(st.sampled_from([8080, 3128, 0])),
            proto=draw(st.sampled_from(["http", "socks5"])),
            latency_ms=draw(st.integers(0, 5000)), source=ev.url_id(url), lease=lease,
            anonymity=draw(st.sampled_from(["", "elite"])),
        ),
        ev.ProxyFailed: lambda: ev.ProxyFailed(**base, ip=ip, port=8080, proto="http"),
        ev.ProxyReported: lambda: _reported(draw, base, ip),
        # A round long enough to be folded in pieces (PIECE).
        ev.ProxiesChecked: lambda: ev.ProxiesChecked(
            **base, key=draw(st.sampled_from(["s001", "traffic"])), lease=lease,
            results=[_result(draw) for _ in range(draw(st.integers(0, 3 * PIECE)))],
        ),
        ev.SitesChecked: lambda: ev.SitesChecked(
            **base, key="s001", lease=lease,
            results=[
                ev.SiteResult(
                    ip=draw(st.sampled_from(IPS)), port=8080, site=draw(st.sampled_from(SITES)),
                    through=draw(st.integers(0, 3)), blocked=draw(st.integers(0, 3)),
                )
                for _ in range(draw(st.integers(1, 4)))
            ],
        ),
        ev.SiteRuled: lambda: ev.SiteRuled(
            **{**base, "agent": "admin"}, removed=draw(st.booleans()),
            rule=SiteRule(site=draw(st.sampled_from(SITES)), markers=("captcha",)),
        ),
        ev.Located: lambda: ev.Located(
            **base, ip=ip, country=draw(st.sampled_from(["", "DE"])), asn=draw(st.integers(0, 9))
        ),
        ev.Deposited: lambda: ev.Deposited(
            **base, lease=lease, key=key, sha256="ab" * 32, bytes=draw(st.integers(1, 9999)),
            items=draw(st.integers(0, 9)), cursor=draw(st.sampled_from([None, 0, 5])),
        ),
        ev.DepositFolded: lambda: ev.DepositFolded(**base, key=key),
        ev.DepositRejected: lambda: ev.DepositRejected(**base, key=key, reason="digest"),
        ev.SeedPlanned: lambda: ev.SeedPlanned(
            **base, plan="p1", input="input/" + "cd" * 32, ranges=[("r1", 0, 9), ("r2", 10, 19)],
            kind=draw(st.sampled_from(["proxies", "sources"])),
        ),
        ev.AgentEnrolled: lambda: ev.AgentEnrolled(
            **{**base, "agent": "admin"}, name=agent, role=ROLES[agent],
            token_sha256=draw(st.sampled_from(["", "0" * 64, "1" * 64])),
        ),
        ev.Configured: lambda: ev.Configured(
            **{**base, "agent": "admin"}, settings=_settings(draw)
        ),
    }  # fmt: skip


def _reported(draw: st.DrawFn, base: dict[str, Any], ip: str) -> ev.ProxyReported:
    outcome = draw(st.sampled_from(["worked", "failed", "blocked"]))
    site = draw(st.sampled_from(SITES)) if outcome == "blocked" else ""
    return ev.ProxyReported(**base, ip=ip, port=8080, outcome=outcome, site=site)


LEASE_KINDS: list[ev.LeaseKind] = list(get_args(ev.LeaseKind))


@st.composite
def events(draw: st.DrawFn) -> ev.Event:
    builders = _builders(draw)
    return builders[draw(st.sampled_from(sorted(builders, key=lambda t: t.__name__)))]()


def _on_own_subject(event: ev.Event) -> bool:
    try:
        ev.agent_subject(event)
    except ev.SubjectError:
        return False
    return True


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[int, int, bytes, bytes]]:
    """A log: events at non-decreasing server times (sometimes hours apart), some garbage,
    each agent enrolled, settings with the later rules on somewhere, and observations
    on their agents' own subjects or the service's."""
    items: list[ev.Event | None] = draw(
        st.lists(st.one_of(events(), st.just(None)), min_size=1, max_size=60)
    )
    enrolments: list[ev.Event | None] = [
        ev.AgentEnrolled(
            id=_id(draw), agent="admin", at=0, name=name, role=role,
            token_sha256=f"{n:064x}",
        )
        for n, (name, role) in enumerate(ROLES.items())
    ]  # fmt: skip
    items[0:0] = enrolments
    if draw(st.booleans()):
        switch = ev.Configured(id=_id(draw), agent="admin", at=0, settings=_settings(draw))
        items.insert(draw(st.integers(0, len(items))), switch)
    ts = T0
    out = []
    for seq, event in enumerate(items, start=1):
        ts += draw(st.sampled_from([0, 1, 5_000, 70_000, 3_600_000]))
        if event is None:
            out.append((seq, ts, b"ppf.proxy.x", b'{"type": "Bogus"}'))
        elif _on_own_subject(event) and draw(st.booleans()):
            out.append((seq, ts, ev.agent_subject(event).encode(), ev.encode(event)))
        else:
            out.append(message(seq, ts, event))
    return out


@settings(max_examples=5, deadline=None, database=None)
@given(st.data())
def test_the_property_draws_every_event_type_and_lease_kind(data: st.DataObject) -> None:
    """What the properties below fold covers the whole catalogue: a way to make every
    event type, leases of every kind, so no rule is left out of what they check."""
    builders = data.draw(st.composite(_builders)())
    assert set(builders) == set(ev.EVENT_TYPES)
    assert set(LEASE_KINDS) == {"source", "recheck", "seed", "proxy"}
    assert all(isinstance(make(), kind) for kind, make in builders.items())


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


@settings(max_examples=40, deadline=None)
@given(msgs=logs())
def test_an_event_folded_in_one_step_folds_as_in_steps(msgs: list) -> None:  # type: ignore[type-arg]
    """The live fold takes an event that is not a round in one step (``fold_single``)
    and a round in steps (``folding``): every event taken in steps, singles too, builds
    the same projections, every table's rows in the digest."""
    one_step = _fold_all(msgs)
    singles = 0

    def in_steps(state: State, event: Any, seq: int, ts: int) -> bool:
        nonlocal singles
        singles += 1
        return at_once(folding(state, event, seq, ts, []))

    with mock.patch.object(projections.folder, "fold_single", in_steps):
        stepped = _fold_all(msgs)
    assert singles or not msgs or all(b"ProxiesChecked" in m[3] for m in msgs)
    assert digest(stepped) == digest(one_step)


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
