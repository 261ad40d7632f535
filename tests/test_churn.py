"""The churn lab's schedule (ops/lab/churn.py): seeded, the profiles' shapes, scaling."""

from __future__ import annotations

import itertools
import statistics

import pytest

import events as ev
from ops.lab.churn import DEATHS, plan, scaled


def test_the_same_seed_gives_the_same_schedule() -> None:
    """Plans are values: the same profile and seed give equal plans, another seed not."""
    assert plan("steady", 50, seed=7) == plan("steady", 50, seed=7)
    assert plan("steady", 50, seed=7) != plan("steady", 50, seed=8)
    assert plan("steady", 50, seed=7).downs != plan("flappy", 50, seed=7).downs


@pytest.mark.parametrize(("profile", "up_s", "down_s"), [("steady", 600, 300), ("flappy", 60, 30)])
def test_up_and_down_times_have_the_profiles_means(profile: str, up_s: int, down_s: int) -> None:
    """Down times (those ending before the run does) and the up times between them
    average the profile's means, within a quarter; every proxy starts up."""
    p = plan(profile, 200, seed=3, duration_s=3_600)
    downs = [
        (d.end_ms - d.start_ms) / 1000 for ds in p.downs for d in ds if d.end_ms < p.duration_ms
    ]
    ups = [(b.start_ms - a.end_ms) / 1000 for ds in p.downs for a, b in itertools.pairwise(ds)]
    assert abs(statistics.mean(downs) / down_s - 1) < 0.25, statistics.mean(downs)
    assert abs(statistics.mean(ups) / up_s - 1) < 0.25, statistics.mean(ups)
    assert p.up_count(0) == 200
    assert all(p.rtt_ms[i] in range(100, 401) for i in range(200))
    assert set(p.servers) == {"microsocks", "tinyproxy"}


def test_every_way_of_dying_is_in_the_schedule() -> None:
    """Refusing, silent and tarpit deaths each make up a good share."""
    p = plan("flappy", 200, seed=1, duration_s=1_800)
    hows = [d.how for ds in p.downs for d in ds]
    assert {how: hows.count(how) / len(hows) > 0.25 for how in DEATHS} == dict.fromkeys(
        DEATHS, True
    )


def test_outage_kills_half_at_once_and_they_stay_down() -> None:
    """At the midpoint a seeded half dies, every one of them down to the end."""
    p = plan("outage", 200, seed=5, duration_s=3_600)
    mid = p.duration_ms // 2
    dead = [i for i in range(200) if not any(p.up(i, t) for t in range(mid, p.duration_ms, 60_000))]
    assert len(dead) >= 100
    assert p.up_count(mid - 1) - p.up_count(mid) >= 60  # most of the half were up before
    assert p.up_count(mid) <= 100


def test_bad_plans_are_refused() -> None:
    """An unknown profile or an empty run is a clear error."""
    with pytest.raises(ValueError, match="profile"):
        plan("chaotic")
    with pytest.raises(ValueError, match="positive"):
        plan("steady", proxies=0)


def test_ppf_runs_on_the_labs_clock() -> None:
    """Durations divided by the speed, rates per hour multiplied; speed 1 to 10 only."""
    s = scaled(ev.Settings(), 10)
    assert (s.proxy_ttl_s, s.recheck_failing_s, s.spot_window_s) == (1_440, 30, 180)
    assert (s.report_budget_per_hour, s.quota_events_per_min) == (1_000, 30_000)
    assert s.ema_alpha == ev.Settings().ema_alpha
    assert scaled(ev.Settings(), 1) == ev.Settings()
    for speed in (0.5, 11):
        with pytest.raises(ValueError, match="speed"):
            scaled(ev.Settings(), speed)


def test_the_consumer_scores_an_outage_from_what_it_saw() -> None:
    """The outage figures of ``ppf bench pool`` (pure arithmetic over the consumer's
    polls): the killed half leaves ``alive`` 40 s after the mass death, one killed
    proxy is never dropped, precision is back when three polls in a row reach 0.95,
    and a proxy that stayed up but was not served for 30 s shows as the longest gap;
    one up but not in the pool before the mass death is counted apart, not as a gap."""
    from types import SimpleNamespace

    from ops.bench.pool import Consumer

    schedule = plan("outage", 20, seed=5, duration_s=600)
    world = SimpleNamespace(churn=schedule, speed=1.0, churn_t0=0.0)
    at = 300.0
    killed = [i for i in range(20) if schedule.up(i, 299_999) and not schedule.up(i, 599_000)]
    killed = [i for i in killed if any(d.start_ms == 300_000 for d in schedule.downs[i])]
    others = [i for i in range(20) if schedule.up(i, 300_000)]
    assert len(killed) >= 3 and others
    assert len(others) >= 2
    stubborn, gap, absent = killed[0], others[0], others[1]
    next_death = min(
        [d.start_ms / 1000 for d in schedule.downs[gap] if d.start_ms > 300_000] or [600.0]
    )
    assert next_death > 350
    consumer = Consumer.__new__(Consumer)
    consumer.world = world  # type: ignore[assignment]
    times = [float(t) for t in range(0, 600, 10)]
    consumer.seen = [
        [
            (
                t,
                (t < at + 40 or i == stubborn)
                if i in killed
                else not (i == gap and at + 10 <= t <= at + 40) and i != absent,
            )
            for t in times
        ]
        for i in range(20)
    ]
    # precision by poll: 0.5 until 360 s, then 1.0
    consumer.polls = [(t, 10, 5 if t < 360 else 10) for t in times]
    got = consumer._outage()
    assert got["outage_killed"] == len(killed)
    assert got["outage_gone_s_median"] == 40.0
    assert got["outage_never_gone"] == 1
    assert got["outage_precision_095_after_s"] == 80.0  # the polls at 360, 370, 380
    assert got["outage_others_longest_unserved_s"] == 30.0
    assert got["outage_others_not_served_then"] == 1
    assert got["outage_others_up"] == len(others)
