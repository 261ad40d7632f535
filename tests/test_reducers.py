"""The reducers' rules (docs/architecture.md §4), one fact at a time, on pure state."""

from __future__ import annotations

import pytest

import events as ev
from projections.core.readmodels import (
    ProxyFilter,
    due_sources,
    percentile,
    proxy_status,
    query_proxies,
    source_score,
)
from reducers import State, fold
from reducers.proxies import SWEEP_MS
from reducers.state import latency_samples
from tests.helpers import eid, leased, released, worked

T0 = 1_800_000_000_000


class Log:
    """Folds events with increasing sequences at chosen times."""

    def __init__(self) -> None:
        self.state = State()
        self.seq = 0

    def __call__(self, event: ev.Event, at_s: float = 0) -> bool:
        self.seq += 1
        return fold(self.state, event, self.seq, T0 + int(at_s * 1000))  # type: ignore[arg-type]


# -- proxies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "port"),
    [
        ("10.0.0.1", 80),
        ("1.2.3.4", 0),
        ("999.1.1.1", 80),
        ("127.0.0.1", 3128),
        ("192.168.1.1", 8080),
        ("224.0.0.1", 80),
        ("1.2.3.4", 65536),
        ("01.2.3.4", 80),
        ("1.2.3", 80),
        ("::1", 80),
        ("fe80::1", 80),
    ],
)
def test_non_public_addresses_never_become_proxies(ip: str, port: int) -> None:
    """Non-public addresses never become proxies outside lab mode."""
    log = Log()
    log(worked(ip, port))
    assert log.state.proxies == {}
    assert log.state.agents["w1"].rejected == 1


def test_lab_mode_from_the_log_admits_loopback() -> None:
    """Settings come from the last Configured event before the message."""
    log = Log()
    log(worked("127.0.0.1", 3128))
    log(ev.Configured(id=eid(), agent="admin", at=0, settings=ev.Settings(lab=True)))
    log(worked("127.0.0.1", 3128))
    assert list(log.state.proxies) == [("127.0.0.1", 3128)]
    log(ev.Configured(id=eid(), agent="admin", at=0, settings=ev.Settings(lab=False)))
    log(worked("10.1.1.1", 3128))
    assert ("10.1.1.1", 3128) not in log.state.proxies
    log(worked("1.1.1.1", 0))
    assert ("1.1.1.1", 0) not in log.state.proxies


def test_confirmations_latency_and_provenance() -> None:
    """Confirmations count, latency is an EMA, agents and sources are kept."""
    log = Log()
    for i, lat in enumerate([100, 200, 300, 400]):
        log(
            worked(
                latency_ms=lat,
                agent=f"w{i % 2}",
                source="src1",
                exit_ip="9.9.9.9",
                anonymity="elite",
            ),
            at_s=i,
        )
    row = log.state.proxies[("8.8.8.8", 8080)]
    assert row.confirmations == 4
    assert latency_samples(row) == [100, 200, 300, 400]
    assert row.agents == ("w0", "w1")
    assert row.sources == ("src1",)
    assert row.first_seen == T0 and row.last_seen == T0 + 3000
    assert 100 < row.latency_ema < 400
    assert (row.exit_ip, row.anonymity) == ("9.9.9.9", "elite")
    assert percentile(latency_samples(row), 0.5) in (200, 300)
    assert percentile(latency_samples(row), 0.95) == 400


def test_latency_samples_are_bounded() -> None:
    """A proxy keeps a bounded number of latency samples."""
    log = Log()
    for i in range(40):
        log(worked(latency_ms=i))
    log(worked(latency_ms=70_000))
    samples = latency_samples(log.state.proxies[("8.8.8.8", 8080)])
    assert samples == [*range(25, 40), 65_535]


def test_liveness_follows_ttl() -> None:
    """alive within the TTL, stale to three TTLs, dead after."""
    log = Log()
    log(worked())
    row = log.state.proxies[("8.8.8.8", 8080)]
    ttl = 3600
    assert proxy_status(row, T0 + ttl * 1000, ttl) == "alive"
    assert proxy_status(row, T0 + ttl * 1000 + 1, ttl) == "stale"
    assert proxy_status(row, T0 + 3 * ttl * 1000 + 1, ttl) == "dead"
    alive = query_proxies(log.state, T0, ProxyFilter())
    assert [r.ip for r in alive] == ["8.8.8.8"]
    assert query_proxies(log.state, T0 + 10 * ttl * 1000, ProxyFilter()) == []
    assert query_proxies(log.state, T0, ProxyFilter(proto="socks5")) == []


def test_dead_proxies_are_evicted_by_log_time() -> None:
    """Proxies dead for three TTLs are evicted at the log's time, not the clock's."""
    log = Log()
    log(worked("8.8.8.8"))
    ttl_ms = log.state.settings.proxy_ttl_s * 1000
    log(worked("8.8.4.4"), at_s=(3 * ttl_ms) / 1000)
    assert ("8.8.8.8", 8080) in log.state.proxies  # not past 3 TTLs yet
    log(worked("8.8.4.4"), at_s=(3 * ttl_ms + SWEEP_MS + 1) / 1000)
    assert ("8.8.8.8", 8080) not in log.state.proxies
    assert ("8.8.8.8", 8080) in log.state.dirty["proxies"]  # the delete reaches DuckDB
    assert ("8.8.4.4", 8080) in log.state.proxies


def test_failed_recheck_counts_streak_on_known_proxies_only() -> None:
    """A failed recheck raises the streak of a known proxy and creates none."""
    log = Log()
    fail = ev.ProxyFailed(id=eid(), agent="c1", at=0, ip="8.8.8.8", port=8080, proto="http")
    log(fail)
    assert log.state.proxies == {}
    log(worked())
    log(ev.ProxyFailed(id=eid(), agent="c1", at=0, ip="8.8.8.8", port=8080, proto="http"))
    assert log.state.proxies[("8.8.8.8", 8080)].fail_streak == 1
    log(worked())
    assert log.state.proxies[("8.8.8.8", 8080)].fail_streak == 0


def test_redelivered_sequence_changes_nothing() -> None:
    """A sequence applied already changes nothing when delivered again."""
    log = Log()
    event = worked()
    assert fold(log.state, event, 5, T0)
    before = log.state.proxies[("8.8.8.8", 8080)].confirmations
    assert not fold(log.state, event, 5, T0)
    assert not fold(log.state, worked(), 3, T0)
    assert log.state.proxies[("8.8.8.8", 8080)].confirmations == before == 1


# -- lease ledger ---------------------------------------------------------------


def test_first_claim_wins_and_the_second_is_lost() -> None:
    """The first valid claim on a target wins; the second is recorded lost."""
    log = Log()
    a, b = leased("t1", "w1"), leased("t1", "w2")
    log(a)
    log(b)
    row = log.state.leases["t1"]
    assert (row.status, row.holder, row.lease, row.epoch) == ("leased", "w1", a.lease, 1)
    assert row.lost == 1
    assert log.state.agents["w2"].lost == 1


def test_expired_lease_is_re_granted_and_counts_an_attempt() -> None:
    """An expired lease can be claimed again and counts an attempt."""
    log = Log()
    log(leased("t1", "w1", ttl_s=60))
    second = leased("t1", "w2", ttl_s=60)
    log(second, at_s=61)
    row = log.state.leases["t1"]
    assert (row.holder, row.attempts, row.epoch) == ("w2", 1, 2)
    assert row.lease == second.lease


def test_heartbeat_extends_and_late_events_change_nothing() -> None:
    """A heartbeat extends a held lease; events naming a lost lease change none."""
    log = Log()
    a = leased("t1", "w1", ttl_s=60)
    log(a)
    log(ev.Heartbeat(id=eid(), agent="w1", at=0, leases=[a.lease]), at_s=50)
    assert log.state.leases["t1"].expires_at == T0 + 110_000
    log(leased("t1", "w2"), at_s=100)  # still held: lost
    assert log.state.leases["t1"].holder == "w1"
    log(ev.Heartbeat(id=eid(), agent="w1", at=0, leases=[a.lease]), at_s=200)  # too late
    assert log.state.agents["w1"].late == 1
    assert log.state.leases["t1"].status == "free"
    assert log.state.leases["t1"].attempts == 1


def test_release_outcomes_and_the_attempt_budget() -> None:
    """Failed releases count attempts up to the budget; done resets them."""
    log = Log()
    for i in range(4):
        lease = leased("t1")
        log(lease, at_s=i)
        log(released(lease, "failed"), at_s=i)
    assert log.state.leases["t1"].attempts == 4
    lease = leased("t1")
    log(lease, at_s=10)
    log(released(lease, "abandoned", counted=False), at_s=10)
    assert log.state.leases["t1"].attempts == 4
    lease = leased("t1")
    log(lease, at_s=11)
    log(released(lease, "done"), at_s=11)
    assert log.state.leases["t1"].attempts == 0
    for i in range(5):
        lease = leased("t1")
        log(lease, at_s=20 + i)
        log(released(lease, "failed"), at_s=20 + i)
    assert log.state.leases["t1"].status == "failed"
    blocked = leased("t1")
    assert log(blocked, at_s=30)
    assert log.state.leases["t1"].lease != blocked.lease
    log(ev.LeaseReset(id=eid(), agent="admin", at=0, target="t1"), at_s=31)
    again = leased("t1")
    log(again, at_s=32)
    assert log.state.leases["t1"].lease == again.lease


def test_release_by_a_non_holder_is_late() -> None:
    """A release by an agent that does not hold the lease is late and frees nothing."""
    log = Log()
    lease = leased("t1", "w1")
    log(lease)
    log(ev.Released(id=eid(), agent="w2", at=0, lease=lease.lease, target="t1", outcome="done"))
    assert log.state.leases["t1"].status == "leased"
    assert log.state.agents["w2"].late == 1


def _seed_deposit(lease: ev.Leased, start: int, cursor: int, agent: str = "s1") -> ev.Deposited:
    return ev.Deposited(
        id=eid(),
        agent=agent,
        at=0,
        lease=lease.lease,
        key=f"p/r0/{start}",
        sha256="0" * 64,
        bytes=1,
        items=cursor - start,
        cursor=cursor,
    )


def test_seed_cursor_only_moves_forward_within_the_range() -> None:
    """A seed range's cursor moves forward by batches that start where it stands, and
    never past the range's end; a batch that would cover items again moves nothing."""
    log = Log()
    log(ev.SeedPlanned(id=eid(), agent="admin", at=0, plan="p", input="k", ranges=[("r0", 0, 99)]))
    lease = leased("p-r0", "s1", kind="seed")
    log(lease)
    log(_seed_deposit(lease, 0, 40))
    log(_seed_deposit(lease, 20, 60))  # items 20-39 again: refused
    assert log.state.leases["p-r0"].cursor == 40
    assert log.state.agents["s1"].rejected == 1
    assert "p/r0/20" not in log.state.deposits
    log(_seed_deposit(lease, 40, 500))
    assert log.state.leases["p-r0"].cursor == 100
    assert log.state.pending_deposits == {"p/r0/0", "p/r0/40"}


def test_a_seed_batch_from_a_lost_lease_or_another_range_is_refused() -> None:
    """Only the holder of a range's live lease may deposit its batches: a batch from a
    lease that expired, or from an agent naming a range it does not hold, is refused."""
    log = Log()
    log(ev.SeedPlanned(id=eid(), agent="admin", at=0, plan="p", input="k", ranges=[("r0", 0, 99)]))
    lease = leased("p-r0", "s1", kind="seed")  # ttl 60 s at t=0
    log(lease)
    other = leased("x-r1", "s2", kind="seed")
    log(other)
    log(_seed_deposit(other, 0, 10, agent="s2"))  # s2's lease is not of p/r0
    log(_seed_deposit(lease, 0, 10), at_s=120)  # s1's lease expired at 60 s
    assert log.state.leases["p-r0"].cursor == 0
    assert log.state.deposits == {}
    assert log.state.agents["s1"].rejected == 1 and log.state.agents["s2"].rejected == 1


def test_a_deposit_is_poisoned_after_five_rejected_reads_and_a_new_announcement_retries() -> None:
    """Five DepositRejected poison a deposit (a repeated attempt counts once); folding
    it changes nothing after; a content key announced again gets a new budget."""
    log = Log()
    sha = "a" * 64
    key = f"page/{sha}"
    page = ev.Deposited(id=eid(), agent="w1", at=0, key=key, sha256=sha, bytes=10)
    log(page)
    for attempt in (1, 2, 2, 3, 4):
        log(ev.DepositRejected(id=eid(), agent="fold", at=0, key=key, attempt=attempt))
    assert log.state.deposits[key].status == "pending"
    log(ev.DepositRejected(id=eid(), agent="fold", at=0, key=key, attempt=5, reason="missing"))
    row = log.state.deposits[key]
    assert (row.status, row.attempts, row.reason) == ("poisoned", 5, "missing")
    assert key not in log.state.pending_deposits
    log(ev.DepositFolded(id=eid(), agent="fold", at=0, key=key))
    assert log.state.deposits[key].status == "poisoned"
    log(ev.Deposited(id=eid(), agent="w2", at=0, key=key, sha256=sha, bytes=10))
    assert key in log.state.pending_deposits
    log(ev.DepositRejected(id=eid(), agent="fold", at=0, key=key, attempt=6))
    log(ev.DepositFolded(id=eid(), agent="fold", at=0, key=key))
    assert log.state.deposits[key].status == "folded"
    log(ev.Deposited(id=eid(), agent="w3", at=0, key=key, sha256=sha, bytes=10))
    assert log.state.deposits[key].status == "folded"  # announced again: nothing changes


# -- sources ------------------------------------------------------------------------


def _fetched(uid: str, ok: bool, changed: bool = True, lease: str = "") -> ev.Fetched:
    return ev.Fetched(
        id=eid(),
        agent="w1",
        at=0,
        url_id=uid,
        lease=lease,
        ok=ok,
        changed=changed,
        content_hash="h",
        fetch_ms=100,
    )


def _source(log: Log, url: str = "http://list.example/p.txt") -> str:
    uid = ev.url_id(url)
    log(ev.SourceAdded(id=eid(), agent="admin", at=0, url=url, url_id=uid))
    return uid


def test_error_rises_only_after_two_consecutive_failures() -> None:
    """A source's error rises only after two failed fetches in a row."""
    log = Log()
    uid = _source(log)
    log(_fetched(uid, ok=False))
    assert log.state.sources[uid].error == 0
    log(_fetched(uid, ok=False))
    assert log.state.sources[uid].error == 1
    log(_fetched(uid, ok=True))
    assert log.state.sources[uid].error == 0
    assert log.state.sources[uid].consecutive_errors == 0


def test_interval_adapts_within_bounds_and_stale_counts() -> None:
    """The check interval adapts within its bounds; unchanged pages count stale."""
    log = Log()
    uid = _source(log)
    for _ in range(30):
        log(_fetched(uid, ok=True, changed=False))
    row = log.state.sources[uid]
    assert row.check_interval == log.state.settings.max_interval_s
    assert row.stale_count == 30
    for _ in range(30):
        log(_fetched(uid, ok=True, changed=True))
    assert row.check_interval == log.state.settings.min_interval_s
    assert row.stale_count == 0


def test_working_ratio_counts_distinct_working_proxies_of_a_fetch() -> None:
    """working_ratio counts each working proxy of a fetch once."""
    log = Log()
    uid = _source(log)
    lease = leased(uid)
    log(lease)
    log(_fetched(uid, ok=True, lease=lease.lease))
    log(ev.Extracted(id=eid(), agent="w1", at=0, url_id=uid, count=4, lease=lease.lease))
    for ip in ("8.8.8.8", "8.8.8.8", "8.8.4.4"):
        log(worked(ip, source=uid, lease=lease.lease))
    log(released(lease))
    row = log.state.sources[uid]
    assert row.working_ratio == pytest.approx(0.5)
    assert row.yield_rate == 4.0
    assert row.proxies_added == 2


def test_score_and_due_order() -> None:
    """Scores follow the contract's formula and order the due sources."""
    log = Log()
    fresh = _source(log, "http://a.example/")
    done = _source(log, "http://b.example/")
    log(_fetched(done, ok=True))
    now = T0 + 1000
    assert source_score(log.state.sources[fresh], now) > source_score(log.state.sources[done], now)
    assert [r.url_id for _, r in due_sources(log.state, now)] == [fresh]
    later = T0 + log.state.sources[done].check_interval * 1000 + 1
    assert {r.url_id for _, r in due_sources(log.state, later)} == {fresh, done}


def test_discovered_links_become_sources_once() -> None:
    """A discovered link becomes a source once, with its parent."""
    log = Log()
    parent = _source(log)
    urls = [f"http://d.example/{i}" for i in range(150)]
    log(ev.Discovered(id=eid(), agent="w1", at=0, parent=parent, urls=urls))
    log(ev.Discovered(id=eid(), agent="w1", at=0, parent=parent, urls=urls[:5]))
    found = [s for s in log.state.sources.values() if s.origin == "discovered"]
    assert len(found) == 100
    assert all(s.parent == parent for s in found)
