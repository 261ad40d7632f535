"""Liveness follows the evidence: a proxy whose latest check failed is suspect, not
served, until its next success (ARCHITECTURE.md, Changes: status ``suspect``)."""

from __future__ import annotations

import events as ev
from projections.readmodels import ProxyFilter, query_proxies
from projections.snapshot import build
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
