"""Workers earn trust (reducers/trust.py), on pure state through the fold's own door.

Every message goes through ``Folder`` as the live fold and replay take it, on the
subject its publisher could write: an agent's observations on ``ppf.in.<agent>.>``, the
operator's settings and enrolments on the service's subjects.
"""

from __future__ import annotations

from typing import Any

import msgspec

import events as ev
from projections.core.digest import digest
from projections.core.poolview import build
from projections.core.readmodels import ProxyFilter
from projections.core.recheck import due_in_shard, shards, spot_checks
from projections.folder import Folder
from projections.store import Store, collect
from reducers import State
from reducers.rows import TrustBase
from tests.folded import OPERATOR, T0, FoldedLog, ip, settings
from tests.helpers import eid


def test_an_untrusted_report_waits_for_a_trusted_check_and_a_second_name_does_not_count() -> None:
    """An untested worker's report is unconfirmed, not served, however many untested names
    repeat it; one check by the operator's checker serves it and tests every name that made
    it."""
    f = FoldedLog()
    f.enrol("mallory", "worker")
    f.enrol("mallory2", "worker")
    f.report("w-own", ip(1))
    f.report("mallory", ip(2))
    f.report("mallory2", ip(2), at_s=1)
    assert f.served(2) == {ip(1)}
    view = {v.ip: v for v in build(f.state).select(ProxyFilter(status="unconfirmed"), T0)}
    assert set(view) == {ip(2)}
    f.check(ip(2), True, at_s=60)
    assert f.served(61) == {ip(1), ip(2)}
    assert f.state.agents["mallory"].spot_checks == 1  # and both names were tested by it
    assert f.state.agents["mallory2"].spot_checks == 1


def test_a_fabricating_worker_falls_and_its_proxies_leave_the_pool_and_the_checkers_list() -> None:
    """A worker whose sampled reports fail the operator's checks falls: none of its
    fabrications is served, no more checks are spent on them, and the honest pool is
    untouched."""
    f = FoldedLog()
    f.enrol("mallory", "worker")
    honest = [ip(i) for i in range(20)]
    fake = [ip(1000 + i) for i in range(400)]
    for i, addr in enumerate(honest):
        f.report("w-own", addr, at_s=i)
    for i, addr in enumerate(fake):
        f.report("mallory", addr, at_s=30 + i * 0.1)
    # The checkers take the sample first: all of it is what the gateway hands out now.
    urgent = spot_checks(f.state)
    assert urgent and urgent <= {(a, 8080) for a in fake}
    assert len(urgent) < len(fake) // 2  # a sample, not everything a liar says
    rows = [r for rs in shards(f.state).values() for r in rs]
    first = due_in_shard(rows, T0 + 100_000, 10, urgent=urgent)
    assert {(r.ip, r.port) for r in first} <= urgent  # ahead of every routine recheck
    for n, (addr, _) in enumerate(sorted(urgent)[:12]):
        f.check(addr, False, at_s=120 + n)
    assert f.level("mallory") == "fallen"
    assert f.served(200) == set(honest)
    assert not spot_checks(f.state)  # no more checks spent on its word
    listed = {r.ip for rs in shards(f.state).values() for r in rs}
    assert listed == set(honest)


def test_an_honest_worker_earns_trust_and_its_unchecked_reports_are_then_served() -> None:
    """Reports that hold up earn trust after ``trust_after`` spot-checks; from then the
    worker's unchecked reports are served too."""
    f = FoldedLog(trust_after=5)
    f.enrol("alice", "worker")
    found = [ip(i) for i in range(30)]
    for i, addr in enumerate(found):
        f.report("alice", addr, at_s=i)
    assert f.served(40) == set()
    for n, addr in enumerate(found[:4]):
        f.check(addr, True, at_s=60 + n)
    assert f.level("alice") == "untested"
    assert f.served(70) == set(found[:4])
    f.check(found[4], True, at_s=70)
    assert f.level("alice") == "earned"
    assert f.served(80) == set(found)  # the rest, unchecked, on its word now


def test_churn_does_not_count_against_a_worker() -> None:
    """Half of what the operator's own worker reports is dead by the next check: a
    worker whose reports fail as often has shown nothing wrong."""
    f = FoldedLog(trust_after=10)
    f.enrol("bob", "worker")
    for i in range(200):
        f.report("w-own", ip(i), at_s=i)
        f.check(ip(i), i % 2 == 0, at_s=i + 60)
    assert f.state.trust_base.checks == 200
    for i in range(20):
        f.report("bob", ip(500 + i), at_s=400 + i)
        f.check(ip(500 + i), i % 2 == 0, at_s=460 + i)
    assert f.level("bob") == "earned"


def test_a_check_long_after_the_report_is_not_a_spot_check() -> None:
    """A check later than ``spot_window_s`` after the report says nothing about the reporter
    (the proxy may have died since), and one report is tested once."""
    f = FoldedLog(spot_window_s=600)
    f.enrol("carol", "worker")
    f.report("carol", ip(1))
    f.check(ip(1), False, at_s=601)
    assert f.state.agents["carol"].spot_checks == 0
    f.report("carol", ip(1), at_s=700)
    f.check(ip(1), False, at_s=710)
    f.check(ip(1), False, at_s=720)  # the same report is tested once
    assert (f.state.agents["carol"].spot_checks, f.state.agents["carol"].spot_failed) == (1, 1)


def test_revoking_an_earned_agent_takes_its_unconfirmed_reports_out() -> None:
    """A revoked agent vouches for nothing: what only it confirmed leaves the served pool; what
    the operator's checker confirmed stays."""
    f = FoldedLog(trust_after=2)
    f.enrol("dave", "worker")
    for i in range(5):
        f.report("dave", ip(i), at_s=i)
    f.check(ip(0), True, at_s=10)
    f.check(ip(1), True, at_s=11)
    assert f.served(20) == {ip(i) for i in range(5)}
    f.enrol("dave", "worker", token="")  # ppf token revoke
    assert f.level("dave") == "revoked"
    assert f.served(30) == {ip(0), ip(1)}  # what the operator's checker confirmed stays


def test_the_operator_trusts_and_untrusts_by_settings() -> None:
    """``trusted_agents`` in ``Configured`` makes an agent the operator's, and taking it out
    puts it back to earning trust, at that point of the log."""
    f = FoldedLog()
    f.enrol("erin", "worker")
    f.report("erin", ip(1))
    assert f.served(1) == set()
    f.service(ev.Configured(id=eid(), agent="admin", at=0, settings=settings(
        trusted_agents=(*OPERATOR, "erin"))))  # fmt: skip
    assert (f.level("erin"), f.served(2)) == ("trusted", {ip(1)})
    f.service(ev.Configured(id=eid(), agent="admin", at=0, settings=settings()))
    assert (f.level("erin"), f.served(3)) == ("untested", set())


def test_a_crowd_of_fresh_names_cannot_keep_a_proxy_unconfirmable() -> None:
    """Sybils filling a proxy's capped provenance cannot keep the operator's checker out of it."""
    f = FoldedLog(provenance_cap=4)
    for i in range(6):
        f.enrol(f"sybil{i}", "worker")
        f.report(f"sybil{i}", ip(1), at_s=i)
    assert len(f.state.proxies[(ip(1), 8080)].agents) == 4
    f.check(ip(1), True, at_s=20)
    assert "c-own" in f.state.proxies[(ip(1), 8080)].agents
    assert f.served(21) == {ip(1)}


def test_quotas_refuse_to_the_dlq_and_spare_the_operators_agents() -> None:
    """Past a quota (events a minute, new proxies or proposed sources an hour) the fold refuses
    to the DLQ as ``quota`` with the count; known proxies are not new; the operator's agents
    have none; a new window starts afresh."""
    f = FoldedLog(quota_events_per_min=5, quota_proxies_per_hour=8, quota_sources_per_hour=3)
    f.enrol("frank", "worker")
    for i in range(7):
        f.report("frank", ip(i), at_s=i)  # one minute: 5 pass
    assert len(f.refused) == 2 and {r for r, _ in f.refused} == {"quota"}
    assert "events this minute" in f.refused[0][1]
    for i in range(7, 12):
        f.report("frank", ip(i), at_s=70 + i)  # a new minute: 3 more new proxies pass
    assert len(f.state.proxies) == 8
    assert "new proxies this hour" in f.refused[-1][1]
    f.report("frank", ip(0), at_s=90)  # a known one is not new
    assert len(f.refused) == 4
    urls = [f"http://list{i}.example.com/p.txt" for i in range(4)]
    f.says(ev.Discovered(id=eid(), agent="frank", at=0, parent="0" * 16, urls=urls), 200)
    assert "sources this hour" in f.refused[-1][1]
    for i in range(20):
        f.report("w-own", ip(100 + i), at_s=300)
    assert len(f.refused) == 5  # the operator's worker has no quota
    f.report("frank", ip(50), at_s=3_700)  # the next hour
    assert len(f.refused) == 5


def test_the_same_log_gives_the_same_trust_after_a_restart(tmp_path: Any) -> None:
    """Standings, the baseline and who is trusted come back the same from a checkpoint, and a
    replay of the same log gives the same digest."""
    f = FoldedLog(trust_after=3)
    f.enrol("gina", "worker")
    f.enrol("hank", "worker")
    for i in range(6):
        f.report("gina", ip(i), at_s=i)
        f.report("hank", ip(100 + i), at_s=i)
        f.report("w-own", ip(200 + i), at_s=i)
    for i in range(3):
        f.check(ip(i), True, at_s=30 + i)
        f.check(ip(100 + i), False, at_s=30 + i)
        f.check(ip(200 + i), i != 0, at_s=30 + i)
    assert (f.level("gina"), f.level("hank")) == ("earned", "fallen")
    store = Store(tmp_path / "p.duckdb")
    store.write(collect(f.state))
    restored = store.restore()
    store.close()
    assert digest(restored) == digest(f.state)
    assert (restored.trusted, restored.judges) == (f.state.trusted, f.state.judges)
    assert restored.trust_base == f.state.trust_base == TrustBase(3, 1)
    assert (
        msgspec.json.encode(restored.trust_base) == b"[3,1]"
    )  # as it was kept before it had names
    again = State()
    Folder(again).apply(f.messages)
    assert digest(again) == digest(f.state)


def test_a_trust_after_of_zero_judges_at_the_first_spot_check() -> None:
    """``trust_after: 0`` is a setting an operator may publish: it judges at once, and
    never divides by an empty record."""
    f = FoldedLog(trust_after=0)
    f.enrol("ivan", "worker")
    f.report("ivan", ip(1))
    f.check(ip(1), False, at_s=10)
    assert f.level("ivan") == "fallen"
