"""Quality signals folded from the checks (reducers/quality.py) and read as a pool is
read (projections/core/quality.py): uptime by time between checks, the unbroken run of
successes, the download speed, datacenter or not; an untested agent moves none of them,
and a log written before the setting folds as it did."""

from __future__ import annotations

import events as ev
from projections import digests
from projections.core.poolview import building
from projections.core.quality import datacenter, stable_since, uptime
from projections.core.readmodels import ProxyFilter, query_proxies
from reducers.quality import DAY_MS, WINDOW_DAYS
from reducers.steps import at_once
from tests.folded import T0, FoldedLog
from tests.helpers import eid, worked

P = "45.60.1.2"


def _log(**kw: object) -> FoldedLog:
    log = FoldedLog(quality=True, **kw)
    log.enrol("w-new", "worker")
    return log


def test_uptime_is_the_share_of_time_between_checks_not_of_checks() -> None:
    """Up 0-60 s, failing checks at 120 s, 125 s, 130 s and 180 s (checked often while
    failing), up again at 240 s: two changes, each counted half and half between its
    checks. 120 of 240 s known were up, though 4 of the 7 checks failed; the run of
    successes starts at the last success after a failure."""
    log = _log()
    for at, ok in ((0, True), (60, True), (120, False), (125, False), (130, False)):
        log.check(P, ok, at)
    log.check(P, False, 180)
    log.check(P, True, 240)
    q = log.state.quality[(P, 8080)]
    assert (q.checks, q.last_ok) == (7, True)
    assert uptime(q, log.ts(240)) == 0.5
    assert stable_since(q) == log.ts(240)
    log.check(P, True, 300)
    assert stable_since(log.state.quality[(P, 8080)]) == log.ts(240)  # unbroken
    log.check(P, False, 360)
    assert stable_since(log.state.quality[(P, 8080)]) == 0


def test_a_span_longer_than_twice_the_dead_recheck_is_not_known() -> None:
    """Checks 13 hours apart (recheck_dead_s 6 h: at most 12 h counts) leave the span
    unknown: the proxy was not looked at, and a run of successes across it is a new one."""
    log = _log()
    log.check(P, True, 0)
    log.check(P, True, 13 * 3600)
    q = log.state.quality[(P, 8080)]
    assert uptime(q, log.ts(13 * 3600)) is None
    assert stable_since(q) == log.ts(13 * 3600)
    log.check(P, False, 13 * 3600 + 60)
    assert uptime(log.state.quality[(P, 8080)], log.ts(13 * 3600 + 60)) == 0.5


def test_days_are_kept_for_the_window_and_read_for_the_last_seven() -> None:
    """A proxy down its first two days and up the next eight (checked every 6 h): its
    days past the window are dropped, and the uptime of the last seven days is 1.0, of
    all ten it would have been 0.8."""
    log = _log()
    start = (DAY_MS - T0 % DAY_MS) / 1000  # the first midnight of log time
    for k in range(41):
        log.check(P, k > 8, start + k * 6 * 3600)
    q = log.state.quality[(P, 8080)]
    assert len(q.known) == WINDOW_DAYS
    assert uptime(q, log.ts(start + 40 * 6 * 3600)) == 1.0
    assert sum(q.known) == WINDOW_DAYS * DAY_MS


def test_an_untested_agents_checks_move_no_figure() -> None:
    """With trust on, a check from an agent nobody vouches for adds no row and moves no
    figure; the operator's checker's do."""
    log = _log()
    log.says(worked(P, 8080, agent="w-new"), 0)
    log.says(worked(P, 8080, agent="w-new", speed_kb_s=900), 60)
    assert (P, 8080) not in log.state.quality
    log.says(worked(P, 8080, agent="c-own", speed_kb_s=250), 120)
    assert log.state.quality[(P, 8080)].speed_kb_s == 250
    log.says(worked(P, 8080, agent="w-new", speed_kb_s=900), 180)
    assert log.state.quality[(P, 8080)].speed_kb_s == 250
    assert log.state.quality[(P, 8080)].checks == 1


def test_a_log_without_the_setting_folds_no_quality_and_keeps_its_digest() -> None:
    """The same checks in a log before the setting: no row, and no part of the digest
    for the table; an evicted proxy's row goes with it."""
    log = FoldedLog()
    log.check(P, True, 0)
    log.check(P, False, 60)
    assert not log.state.quality and "quality" not in digests(log.state)
    on = _log()
    on.check(P, True, 0)
    assert "quality" in digests(on.state)
    # Three TTLs later another proxy's check sweeps it, and its figures with it.
    on.says(worked("45.60.1.3", 8080, agent="c-own"), 5 * 24 * 3600)
    assert (P, 8080) not in on.state.proxies and (P, 8080) not in on.state.quality


def test_the_pool_is_read_by_its_signals() -> None:
    """min_uptime, stable_for_s, min_speed_kb_s and datacenter select the same proxies
    from the projection and from a pool view."""
    log = _log()
    for n, ok_at_60 in enumerate((True, False)):
        log.says(worked(f"45.60.1.{n + 2}", 8080, agent="c-own", speed_kb_s=100 * (n + 1)), 0)
        log.check(f"45.60.1.{n + 2}", ok_at_60, 60)
        log.check(f"45.60.1.{n + 2}", True, 120)
    now = log.ts(130)
    view = at_once(building(log.state, now))

    def both(f: ProxyFilter) -> set[str]:
        rows = {r.ip for r in query_proxies(log.state, now, f, limit=0)}
        views = {v.ip for v in view.select(f, now, limit=0)}
        assert rows == views
        return rows

    assert both(ProxyFilter(min_uptime=0.9)) == {"45.60.1.2"}
    assert both(ProxyFilter(min_uptime=0.5)) == {"45.60.1.2", "45.60.1.3"}
    assert both(ProxyFilter(stable_for_s=100)) == {"45.60.1.2"}
    assert both(ProxyFilter(min_speed_kb_s=150)) == {"45.60.1.3"}
    assert both(ProxyFilter(datacenter="yes")) == set()  # no AS known: neither
    assert both(ProxyFilter(datacenter="no")) == set()


def test_datacenter_is_read_from_the_as_name_by_ppfs_list() -> None:
    """The large clouds by name, hosting networks by the words they use; an access
    network is not one, and an address with no AS known is neither."""
    assert datacenter("AMAZON-02") == "yes"
    assert datacenter("Hetzner Online GmbH") == "yes"
    assert datacenter("Iron Hosting Centre LTD") == "yes"
    assert datacenter("Deutsche Telekom AG") == "no"
    assert datacenter("COMCAST-7922") == "no"
    assert datacenter("") == ""


def test_a_check_result_carries_its_speed_into_the_event_it_stands_for() -> None:
    """A round's result with a speed folds as the single event with that speed."""
    log = _log()
    result = ev.CheckResult(ip=P, port=8080, proto="http", latency_ms=90, speed_kb_s=321)
    log.says(ev.ProxiesChecked(id=eid(), agent="c-own", at=0, key="k", results=[result]), 0)
    assert log.state.quality[(P, 8080)].speed_kb_s == 321
