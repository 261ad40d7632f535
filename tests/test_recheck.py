"""Recheck intervals that follow what each proxy has shown, and the operator's budget."""

from __future__ import annotations

from typing import Any

import pytest

import events as ev
from eventlog.client import Log, fresh_id
from gateway.leases import CheckBudget
from ops.cli import enroll
from projections.core.recheck import (
    RecheckPolicy,
    due_in_shard,
    flapping,
    for_another_vantage,
    has_due,
    interval_s,
)
from reducers.state import ProxyRow
from tests.fleet import serving
from tests.helpers import worked

NOW = 1_800_000_000_000
DAY = 86_400_000


def _row(**kw: Any) -> ProxyRow:
    base: dict[str, Any] = {
        "ip": "8.8.8.8",
        "port": 80,
        "proto": "http",
        "protos": ("http",),
        "first_seen": NOW - 7 * DAY,
        "last_seen": NOW,
        "confirmations": 50,
    }
    return ProxyRow(**(base | kw))


def test_failing_proxies_come_back_soon_then_ever_more_rarely() -> None:
    """After one failure, failing_s; each further failure doubles it, up to dead_s."""
    p = RecheckPolicy(failing_s=300, dead_s=3_600)
    got = [interval_s(_row(fail_streak=n), p) for n in (1, 2, 3, 4, 5, 50, 10**6)]
    assert got == [300, 600, 1_200, 2_400, 3_600, 3_600, 3_600]


def test_a_failing_flapper_is_asked_as_often_as_a_fresh_proxy() -> None:
    """A proxy that has come back after failing, about daily or more, and fails again
    is likely to come back again: its failing interval doubles only up to fresh_s, not
    to dead_s, so its return is seen soon; one that never came back goes on doubling."""
    p = RecheckPolicy(failing_s=300, fresh_s=900, dead_s=21_600)
    flappy = [interval_s(_row(flaps=9, fail_streak=n), p) for n in (1, 2, 3, 4, 30)]
    assert flappy == [300, 600, 900, 900, 900]
    dead = [interval_s(_row(flaps=0, fail_streak=n), p) for n in (1, 2, 3, 4, 30)]
    assert dead == [300, 600, 1_200, 2_400, 21_600]


def test_fresh_and_flapping_often_stable_veterans_seldom() -> None:
    """A proxy that came back after failing about once a day or more is flapping, and is
    rechecked as often as a fresh one; one that flapped long ago and held since is not."""
    p = RecheckPolicy(fresh_s=900, settled_s=3_600, veteran_s=7_200)
    assert interval_s(_row(confirmations=1, first_seen=NOW), p) == 900
    flappy = _row(flaps=9)  # nine returns in seven days
    assert flapping(flappy) and interval_s(flappy, p) == 900
    once = _row(flaps=1)
    assert not flapping(once) and interval_s(once, p) == 7_200
    settled_long_since = _row(flaps=3, first_seen=NOW - 30 * DAY)
    assert not flapping(settled_long_since) and interval_s(settled_long_since, p) == 7_200
    assert interval_s(_row(first_seen=NOW - DAY // 2), p) == 3_600


def test_the_intervals_are_the_logs_settings() -> None:
    """RecheckPolicy.of reads the Configured settings, so every gateway schedules alike."""
    s = ev.Settings(
        recheck_failing_s=60,
        recheck_fresh_s=120,
        recheck_settled_s=240,
        recheck_veteran_s=480,
        recheck_dead_s=600,
    )
    p = RecheckPolicy.of(s)
    assert (p.failing_s, p.fresh_s, p.settled_s, p.veteran_s, p.dead_s) == (60, 120, 240, 480, 600)
    rows = [_row(ip="1.1.1.1", fail_streak=1), _row(ip="1.1.1.2", first_seen=NOW)]
    assert {r.ip for r in due_in_shard(rows, NOW + 61_000, 10, p)} == {"1.1.1.1"}


def test_has_due_answers_as_due_in_shard_does() -> None:
    """The gateway asks ``has_due`` of every shard at each recheck lease: it must say
    yes exactly where ``due_in_shard`` would give a row (failing, fresh, settled and
    veteran rows, reported ones, urgent spot-checks, at many moments)."""
    import random

    rng = random.Random(3)
    p = RecheckPolicy(failing_s=60, fresh_s=120, settled_s=240, veteran_s=480, dead_s=960)
    for _ in range(2_000):
        rows = []
        for i in range(rng.randrange(0, 4)):
            seen = NOW - rng.randrange(0, 1_000_000)
            rows.append(
                _row(
                    ip=f"8.8.{i}.{rng.randrange(1, 9)}",
                    last_seen=seen,
                    first_seen=seen - rng.choice([0, DAY // 2, 2 * DAY]),
                    last_failed=rng.choice([0, seen - 1, seen + rng.randrange(1, 500_000)]),
                    fail_streak=rng.choice([0, 0, 1, 3]),
                    confirmations=rng.choice([1, 5]),
                    flaps=rng.choice([0, 3]),
                    reported_at=rng.choice([0, 0, NOW - rng.randrange(0, 900_000)]),
                )
            )
        urgent = {(r.ip, r.port) for r in rows if rng.random() < 0.2}
        now = NOW + rng.randrange(0, 600_000)
        assert has_due(rows, now, p, urgent) == bool(due_in_shard(rows, now, 1, p, urgent))


def test_the_budget_holds_five_minutes_checks_and_refills_evenly() -> None:
    """3,600 an hour: five minutes' (300) at once at first, then one a second; unused
    ones given back; never more in hand than five minutes' worth, nor fewer than one."""
    b = CheckBudget()
    assert b.take(200, 3_600, now_s=0.0) == 200
    assert b.take(5_000, 3_600, now_s=0.0) == 100
    assert b.take(10, 3_600, now_s=0.0) == 0
    assert b.take(10, 3_600, now_s=5.0) == 5
    b.give_back(3, 3_600)
    assert b.take(10, 3_600, now_s=5.0) == 3
    assert b.take(10**6, 3_600, now_s=10**6) == 300
    assert CheckBudget().take(7, 0, now_s=0.0) == 7  # no budget: no cap
    small = CheckBudget()  # 2 an hour: one in hand, the next after 30 minutes
    assert small.take(5, 2, now_s=0.0) == 1
    assert small.take(5, 2, now_s=1_000.0) == 0
    assert small.take(5, 2, now_s=1_801.0) == 1


async def test_a_gateway_hands_out_no_more_checks_than_the_budget(log_client: Log) -> None:
    """With recheck_budget_per_hour 60 (five in hand) and 40 proxies due, the checkers'
    leases carry 5 proxies in all, and then no shard is work until the budget refills."""
    token = await enroll(log_client, "c1", "checker")
    settings = ev.Settings(recheck_fresh_s=0, recheck_budget_per_hour=60)
    await log_client.publish(ev.Configured(id=fresh_id(), agent="admin", at=0, settings=settings))
    for i in range(40):
        await log_client.publish(worked(f"45.60.{i}.1", agent="w-any"))
    async with serving(log_client) as (client, fold):
        assert await fold.wait_for(await log_client.head_seq(), 10)
        assert fold.state.settings.recheck_budget_per_hour == 60 and len(fold.state.proxies) == 40
        headers = {"Authorization": f"Bearer {token}"}
        body = {"agent": "c1", "kind": "recheck", "count": 64}
        r = await client.post("/v1/leases", json=body, headers=headers)
        assert r.status == 200, await r.text()
        leases = (await r.json())["leases"]
        handed = sum(len(g["payload"]["proxies"]) for g in leases)
        assert handed == 5, leases
        r = await client.post("/v1/leases", json=body, headers=headers)
        assert (await r.json())["leases"] == []


@pytest.mark.parametrize("streak", [0, 1])
def test_a_report_of_failure_waits_for_no_interval(streak: int) -> None:
    """A consumer's failed report (reported_at after the last check) is due at once,
    whatever the interval."""
    row = _row(fail_streak=streak, reported_at=NOW + 1_000)
    assert due_in_shard([row], NOW + 2_000, 10, RecheckPolicy()) == [row]


async def test_a_mass_death_in_one_network_is_shown_as_its_outage(log_client: Log) -> None:
    """Six proxies of one network fail their checks at once, two elsewhere fail too:
    /v1/outages names that network's outage (the deaths applied: none is served), and not
    the other, where two failures are only two deaths."""
    one_net = [f"45.60.{i}.1" for i in range(6)]
    elsewhere = [f"77.{i}.0.1" for i in range(4)]
    for ip in one_net + elsewhere:
        await log_client.publish(worked(ip, agent="w-any"))
    for ip in one_net + elsewhere[:2]:
        failed = ev.ProxyFailed(
            id=fresh_id(), agent="c1", at=0, ip=ip, port=8080, proto="http", error="timeout"
        )
        await log_client.publish(failed)
    async with serving(log_client) as (client, fold):
        assert await fold.wait_for(await log_client.head_seq(), 10)
        outages = await (await client.get("/v1/outages")).json()
        assert outages["networks"] == [
            {
                "network": "net:45.60",
                "failing": 6,
                "known": 6,
                "vantages": ["c1"],
                "confirmed": False,
            }
        ]
        served = await (await client.get("/v1/proxies?limit=0")).json()
        assert {p["ip"] for p in served["proxies"]} == set(elsewhere[2:])


def test_a_network_outage_is_confirmed_by_a_second_vantage() -> None:
    """A proxy keeps the agents whose checks failed it until it works again; a network's
    outage seen by one checker is unconfirmed, and that checker leaves its failing
    proxies there to another; once a second checker saw them fail it is confirmed."""
    from projections.folder import Folder
    from reducers import State
    from tests.helpers import message

    state = State()
    folder = Folder(state)
    seq = 0

    def fold(event: ev.Event) -> None:
        nonlocal seq
        seq += 1
        assert folder.apply([message(seq, NOW + seq, event)]) == 1

    ips = [f"45.60.{i}.1" for i in range(6)]
    for ip in ips:
        fold(worked(ip, agent="w-any"))

    def fail(ip: str, agent: str) -> None:
        fold(ev.ProxyFailed(id=fresh_id(), agent=agent, at=0, ip=ip, port=8080, proto="http"))

    for ip in ips:
        fail(ip, "c1")
    fail(ips[0], "c1")  # twice from one vantage is still one
    from projections.core.recheck import network_outages

    [outage] = network_outages(state, NOW + seq)
    assert (outage["vantages"], outage["confirmed"]) == (["c1"], False)
    row = state.proxies[(ips[0], 8080)]
    assert row.failed_by == ("c1",)
    assert for_another_vantage(row, "c1", {"net:45.60"})
    assert not for_another_vantage(row, "c2", {"net:45.60"})
    assert not for_another_vantage(row, "c1", set())  # no outage there: c1 checks it
    for ip in ips:
        fail(ip, "c2")
    [outage] = network_outages(state, NOW + seq)
    assert (outage["vantages"], outage["confirmed"]) == (["c1", "c2"], True)
    assert not for_another_vantage(row, "c1", {"net:45.60"})
    fold(worked(ips[0], agent="c1"))  # back: its failures are history
    assert state.proxies[(ips[0], 8080)].failed_by == ()


@pytest.mark.parametrize("second", [True, False])
async def test_a_checker_leaves_an_outage_only_it_saw_to_another(
    log_client: Log, second: bool
) -> None:
    """c1's checks failed six proxies of one network; while c2 is active, c1's recheck
    leases leave them out (and still carry the rest) and c2's carry them. With no other
    checker active, c1 checks them again itself: nothing waits for a vantage that is
    not there."""
    settings = ev.Settings(recheck_fresh_s=0, recheck_failing_s=0)
    await log_client.publish(ev.Configured(id=fresh_id(), agent="admin", at=0, settings=settings))
    tokens = {name: await enroll(log_client, name, "checker") for name in ("c1", "c2")}
    one_net = [f"45.60.{i}.1" for i in range(6)]
    elsewhere = [f"77.{i}.0.1" for i in range(4)]
    for ip in one_net + elsewhere:
        await log_client.publish(worked(ip, agent="w-any"))
    for ip in one_net:
        failed = ev.ProxyFailed(
            id=fresh_id(), agent="c1", at=0, ip=ip, port=8080, proto="http", error="timeout"
        )
        await log_client.publish(failed)
    if second:
        await log_client.publish(ev.Heartbeat(id=fresh_id(), agent="c2", at=0, leases=[]))

    async def rechecked(name: str) -> set[str]:
        headers = {"Authorization": f"Bearer {tokens[name]}"}
        body = {"agent": name, "kind": "recheck", "count": 64}
        r = await client.post("/v1/leases", json=body, headers=headers)
        assert r.status == 200, await r.text()
        leases = (await r.json())["leases"]
        for g in leases:  # back at once, so the other may lease the same shards
            url = f"/v1/leases/{g['lease']}/release"
            release = {"outcome": "done", "counted": False}
            assert (await client.post(url, json=release, headers=headers)).status == 200
        return {p[0] for g in leases for p in g["payload"]["proxies"]}

    async with serving(log_client) as (client, fold):
        assert await fold.wait_for(await log_client.head_seq(), 10)
        if not second:
            assert await rechecked("c1") == set(one_net + elsewhere)
            return
        assert await rechecked("c1") == set(elsewhere)
        assert await fold.wait_for(await log_client.head_seq(), 10)
        assert await rechecked("c2") == set(one_net + elsewhere)
