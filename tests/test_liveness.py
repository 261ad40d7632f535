"""Liveness follows the evidence: a proxy whose latest check failed is suspect, not
served, until its next success (docs/architecture.md §4: status ``suspect``)."""

from __future__ import annotations

import events as ev
from projections.core.poolview import build
from projections.core.readmodels import ProxyFilter, query_proxies
from projections.core.recheck import due_in_shard
from reducers.indexes import reindex
from tests.folded import T0, FoldedLog, ip
from tests.helpers import eid


def _by_status(log: FoldedLog, status: str, at_s: float) -> set[str]:
    """The same question asked of the live read model and of a query snapshot: they must
    agree, so both are asked and compared."""
    now = T0 + int(at_s * 1000)
    rows = {r.ip for r in query_proxies(log.state, now, ProxyFilter(status=status), limit=0)}
    views = {v.ip for v in build(log.state).select(ProxyFilter(status=status), now, limit=0)}
    assert rows == views, (status, rows, views)
    return rows


def test_a_proxy_whose_latest_check_failed_is_suspect_until_its_next_success() -> None:
    """One failed check by the operator's checker takes a proxy out of alive at once
    (well within the TTL), into suspect; the next success brings it back."""
    log = FoldedLog()
    log.report("w-own", ip(1))
    log.report("w-own", ip(2))
    assert _by_status(log, "alive", 1) == {ip(1), ip(2)}
    log.check(ip(1), False, at_s=60)
    assert log.served(61) == {ip(2)}
    assert _by_status(log, "alive", 61) == {ip(2)}
    assert _by_status(log, "suspect", 61) == {ip(1)}
    log.check(ip(1), False, at_s=120)  # failing again: still suspect, never stale early
    assert _by_status(log, "suspect", 121) == {ip(1)}
    log.check(ip(1), True, at_s=180)
    assert log.served(181) == {ip(1), ip(2)}
    assert _by_status(log, "suspect", 181) == set()


def test_a_failure_from_an_agent_nobody_vouches_for_takes_nothing_out() -> None:
    """With trust on, an untested checker's failures do not make proxies suspect: one
    token must not be able to empty the served pool by saying everything failed."""
    log = FoldedLog()
    log.enrol("mallory", "checker")
    for i in range(5):
        log.report("w-own", ip(i))
    for i in range(5):
        failed = ev.ProxyFailed(
            id=eid(), agent="mallory", at=0, ip=ip(i), port=8080, proto="http", error="timeout"
        )
        log.says(failed, at_s=30)
    assert log.refused == []
    assert log.served(31) == {ip(i) for i in range(5)}
    assert _by_status(log, "suspect", 31) == set()


def test_suspect_ages_like_alive() -> None:
    """Suspect is a state within the TTL: past it the proxy is stale like any other."""
    log = FoldedLog(proxy_ttl_s=600)
    log.report("w-own", ip(1))
    log.check(ip(1), False, at_s=60)
    assert _by_status(log, "suspect", 61) == {ip(1)}
    assert _by_status(log, "stale", 601) == {ip(1)}
    assert _by_status(log, "suspect", 601) == set()


def _report(log: FoldedLog, consumer: str, addr: str, outcome: str, at_s: float) -> None:
    """What the gateway publishes for a consumer: on the service's subject."""
    event = ev.ProxyReported(
        id=eid(),
        agent=consumer,
        at=0,
        ip=addr,
        port=8080,
        outcome=outcome,  # type: ignore[arg-type]
    )
    log.service(event, at_s)


def test_a_consumer_report_that_it_failed_takes_it_out_at_once_and_first_to_the_checkers() -> None:
    """A failed report makes an alive proxy suspect at once and puts it ahead of every
    routine recheck; the checker's next success brings it back."""
    log = FoldedLog()
    log.enrol("shop", "consumer")
    for i in range(3):
        log.report("w-own", ip(i))
    _report(log, "shop", ip(1), "failed", at_s=10)
    assert log.refused == []
    assert log.served(11) == {ip(0), ip(2)}
    assert _by_status(log, "suspect", 11) == {ip(1)}
    rows = list(log.state.proxies.values())
    # Nothing is due by the routine schedule 11 s after the reports; the reported one is.
    assert [r.ip for r in due_in_shard(rows, T0 + 11_000, 10)] == [ip(1)]
    log.check(ip(1), True, at_s=20)
    assert log.served(21) == {ip(0), ip(1), ip(2)}
    assert due_in_shard(list(log.state.proxies.values()), T0 + 21_000, 10) == []


def test_consumer_reports_alone_never_revive_a_proxy() -> None:
    """However many consumers say a suspect or stale proxy worked, it stays what it is
    until a check says otherwise."""
    log = FoldedLog(proxy_ttl_s=600)
    for name in ("shop", "shop2"):
        log.enrol(name, "consumer")
    log.report("w-own", ip(1))
    log.report("w-own", ip(2))
    log.check(ip(1), False, at_s=30)  # suspect
    for at_s, consumer in ((40, "shop"), (41, "shop2"), (700, "shop"), (701, "shop2")):
        _report(log, consumer, ip(1), "worked", at_s)
        _report(log, consumer, ip(2), "worked", at_s)
    assert _by_status(log, "suspect", 42) == {ip(1)}
    assert _by_status(log, "stale", 702) == {ip(1), ip(2)}  # past the TTL: no report helps
    assert log.served(702) == set()
    assert log.state.agents["shop"].rejected == 4  # recorded, and counted as no effect


def test_one_consumer_cannot_empty_the_pool() -> None:
    """Failed reports act within the consumer's budget an hour; past it they are
    recorded and change nothing, and the next hour the budget is back."""
    log = FoldedLog(report_budget_per_hour=3)
    log.enrol("shop", "consumer")
    for i in range(6):
        log.report("w-own", ip(i))
    for i in range(5):
        _report(log, "shop", ip(i), "failed", at_s=10 + i)
    assert len(_by_status(log, "suspect", 20)) == 3
    assert len(log.served(20)) == 3
    _report(log, "shop", ip(5), "failed", at_s=3_600)  # the next hour of log time
    assert len(_by_status(log, "suspect", 3_601)) == 4


def test_a_consumer_cannot_report_on_nats() -> None:
    """A report is the gateway's to publish: on an agent's own subject it is forbidden."""
    log = FoldedLog()
    log.enrol("shop", "consumer")
    log.report("w-own", ip(1))
    event = ev.ProxyReported(id=eid(), agent="shop", at=0, ip=ip(1), port=8080, outcome="failed")
    log.says(event, at_s=5)
    assert [reason for reason, _ in log.refused] == ["forbidden"]
    assert log.served(6) == {ip(1)}


def test_stats_count_what_is_served() -> None:
    """/v1/stats' alive and suspect (the snapshot's census) equal what the read model
    answers row by row, through failures, recoveries, reports and evictions; and a
    restore rebuilds the same failing counts."""
    log = FoldedLog(proxy_ttl_s=600)
    log.enrol("shop", "consumer")
    for i in range(30):
        log.report("w-own", ip(i), at_s=i)
    for i in range(0, 30, 3):
        log.check(ip(i), False, at_s=100 + i)
    for i in range(0, 30, 6):
        log.check(ip(i), True, at_s=200 + i)  # back
    for i in range(1, 30, 5):
        _report(log, "shop", ip(i), "failed", at_s=300 + i)
    for at_s in (400, 2_500):  # the second: all stale, some failing, none alive
        now = T0 + at_s * 1000
        pool = build(log.state).census(now)
        assert pool["alive"] == len(_by_status(log, "alive", at_s))
        assert pool["suspect"] == len(_by_status(log, "suspect", at_s))
    assert build(log.state).census(T0 + 400_000)["suspect"] == 10
    before = dict(log.state.failing.buckets)
    reindex(log.state)
    assert log.state.failing.buckets == before
    log.report("w-own", ip(99), at_s=8_000)  # the sweep evicts the rest, failing ones too
    assert log.state.failing.buckets == {} and len(log.state.proxies) == 1
