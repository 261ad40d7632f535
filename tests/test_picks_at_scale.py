"""A pick at scale (endpoint/router/choose.py): what a pick looks at stays a sample
whatever the pool's size, and what it samples follows what the endpoint learned."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from endpoint.link.upstream import Upstream
from endpoint.router.choose import SAMPLE, Pool
from endpoint.router.login import Want


class _Looked:
    """How many of the pool's upstreams picks looked at, one by one or by index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        looked = self

        class Counted(list[Upstream]):
            def __iter__(self) -> Iterator[Upstream]:
                looked.count += len(self)
                return super().__iter__()

            def __getitem__(self, i: Any) -> Any:
                looked.count += 1
                return super().__getitem__(i)

        matching = Pool._matching
        monkeypatch.setattr(Pool, "_matching", lambda *args: Counted(matching(*args)))


class _Calls:
    """How many times the picks called ``choose``'s function ``name`` (each call counted,
    then made)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        from endpoint.router import choose

        self.count = 0
        real = getattr(choose, name)

        def counted(*args: Any) -> Any:
            self.count += 1
            return real(*args)

        monkeypatch.setattr(choose, name, counted)


def _pool(size: int) -> tuple[Pool, list[Upstream]]:
    pool = Pool(rng=random.Random(3))
    pool.replace(Upstream(f"45.0.{n // 250}.{n % 250}", 8080, "http") for n in range(size))
    return pool, sorted(pool.upstreams.values(), key=lambda u: u.key)


def test_a_pick_at_a_busy_site_looks_at_a_sample_and_follows_what_it_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where every one of 2,000 proxies is known to get through, a pick (an exploring one
    too) looks at a sample of them, not at the pool; and what it picks from follows what
    was learned since: a proxy that lost its standing is not among the known, a new one
    is, one not in the pool never is, and a new pool lets go of those that left it
    without making the rest anew."""
    looked = _Looked(monkeypatch)
    pool, ups = _pool(2_000)
    for up in ups:
        pool.got_through(up, "shop.example")
    picks = [
        pool.pick(Want(consumer="shop"), tunnel=False, now=1.0, site="shop.example")
        for _ in range(400)
    ]
    assert all(picks) and len({p.key for p in picks if p}) > 100
    assert looked.count <= 400 * SAMPLE, looked.count  # each exploring pick: all 2,000

    standing = pool.standing
    assert standing.known("shop.example") is standing.known("shop.example")  # not copied
    assert len(standing.known("shop.example")) == 2_000
    pool.turned_away(ups[0], "shop.example", now=1.0)
    assert ups[0] not in standing.known("shop.example")
    pool.replace([*pool.upstreams.values(), Upstream("46.0.0.1", 8080, "http")])
    assert standing.known("shop.example") == [u for u in ups if u is not ups[0]]
    newer = pool.upstreams[("46.0.0.1", 8080)]
    pool.got_through(newer, "shop.example")
    assert newer in standing.known("shop.example")
    through, listed = standing.through["shop.example"], standing.known("shop.example")
    pool.replace(list(pool.upstreams.values()))  # the same pool again: nothing made anew
    assert standing.through["shop.example"] is through
    assert standing.known("shop.example") is listed
    pool.got_through(Upstream("47.0.0.1", 80, "http"), "shop.example")  # not the pool's
    assert ("47.0.0.1", 80) not in standing.through["shop.example"]
    pool.replace(Upstream(u.ip, u.port, "http") for u in ups[1:3])
    assert standing.known("shop.example") == ups[1:3]


def test_a_pick_at_a_strict_site_looks_as_far_as_it_takes_to_find_the_open_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a site turned 95 % of 2,000 proxies away and none is known to get through, a
    pick whose sample holds no open one looks on from a random one until it has found
    some, not at the whole pool; it never takes a turned-away one, and the picks spread
    over the open ones."""
    looked = _Looked(monkeypatch)
    pool, ups = _pool(2_000)
    draw = random.Random(5)
    open_ = {u.key for u in ups if draw.random() >= 0.95}
    for up in ups:
        if up.key not in open_:
            pool.turned_away(up, "strict.example", now=0.0)
    looked.count = 0
    picks = [
        pool.pick(Want(consumer="shop"), tunnel=False, now=1.0, site="strict.example")
        for _ in range(400)
    ]
    keys = {p.key for p in picks if p}
    assert all(picks) and keys <= open_ and len(keys) > len(open_) / 2, (len(keys), len(open_))
    assert looked.count <= 400 * 400, looked.count  # the sample's misses walked all 2,000


def test_a_sites_rate_limit_holds_whatever_the_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy a site rate-limited takes no more requests a minute there than the site
    let through before, also once the known proxies' budgets are spent and the pick goes
    to any proxy: for every one of 50 seeds (before, the pick for any proxy ignored the
    budgets, and most seeds sent it more); and when every proxy has spent its budget, a
    request still goes through one."""
    from endpoint.router import choose, standing

    monkeypatch.setattr(choose, "EXPLORE", 0.0)
    monkeypatch.setattr(standing, "MIN_EXITS", 1)
    for seed in range(50):
        pool = Pool(rng=random.Random(seed))
        pool.replace([Upstream("8.8.8.8", 80, "http"), Upstream("8.8.4.4", 80, "http")])
        fast, other = pool.upstreams[("8.8.8.8", 80)], pool.upstreams[("8.8.4.4", 80)]
        pool.got_through(fast, "shop.example")
        for _ in range(5):  # five requests this minute, then the 429
            pool.pick(Want(consumer="shop"), tunnel=False, now=60.0, site="shop.example")
        choose.pace(fast, "shop.example", 60.0, 1.0)
        later = [
            pool.pick(Want(consumer="shop"), tunnel=False, now=240.0, site="shop.example")
            for _ in range(6)
        ]
        assert sum(p is fast for p in later) == fast.tolerated["shop.example"] == 4, seed
    other.site_uses["shop.example"] = (4, choose.SITE_BUDGET)  # now both have spent theirs
    assert pool.pick(Want(consumer="shop"), tunnel=False, now=240.0, site="shop.example")


def test_where_most_proxies_spent_their_budget_a_pick_finds_one_that_has_not() -> None:
    """A pool larger than a pick's sample, every proxy but one past its budget at a site
    this minute: each pick goes through the one within its budget, whatever the
    sample's draw (the walk past the sample finds it), and once it has spent its own,
    through any the site has not turned away."""
    from endpoint.router import choose

    pool = Pool(rng=random.Random(3))
    pool.replace(Upstream(f"45.0.1.{n}", 8080, "http") for n in range(1, 51))
    assert len(pool.upstreams) > choose.SAMPLE
    spare = pool.upstreams[("45.0.1.37", 8080)]
    for up in pool.upstreams.values():
        if up is not spare:
            up.site_uses["shop.example"] = (1, choose.SITE_BUDGET)
    picks = [
        pool.pick(Want(consumer="shop"), tunnel=False, now=60.0 + i / 100, site="shop.example")
        for i in range(choose.SITE_BUDGET)
    ]
    assert all(p is spare for p in picks)
    assert spare.site_uses["shop.example"] == (1, choose.SITE_BUDGET)
    pool.turned_away(pool.upstreams[("45.0.1.1", 8080)], "shop.example", now=60.0)
    after = [
        pool.pick(Want(consumer="shop"), tunnel=False, now=62.0, site="shop.example")
        for _ in range(200)
    ]
    keys = {p.key for p in after if p is not None}
    assert len(keys) > 10 and all(after)
    assert ("45.0.1.1", 8080) not in keys


def test_ppf_bench_pick_measures_each_size_in_both_trees_and_refuses_what_it_cannot_measure() -> (
    None
):
    """`ppf bench pick --versus DIR`: the CPU a pick at each site for each pool size in
    this tree and in DIR (here the same tree), each measured in a process of its own;
    what it cannot measure (no size, more picks than fit in the time a block holds) is
    refused."""
    from pathlib import Path

    from ops.bench.options import Pick
    from ops.bench.pick import bench_pick

    here = Path(__file__).resolve().parents[1]
    out = bench_pick(Pick(sizes="50,500", picks=500, runs=2, versus=here))
    for row in (out[f"{site}_{size}"] for site in ("known", "strict") for size in (50, 500)):
        assert len(row["by_run"]) == len(row["versus_by_run"]) == 2, row
        assert row["us"] > 0 and row["versus_us"] > 0 and row["x"] > 0, row
    for bad in ("0", "1k", ""):
        with pytest.raises(SystemExit, match="--sizes"):
            bench_pick(Pick(sizes=bad))
    with pytest.raises(SystemExit, match="--picks"):
        bench_pick(Pick(sizes="10", picks=7_000))


def test_where_every_proxy_spent_its_budget_a_minutes_picks_look_at_them_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,000 proxies, each past its budget at a site this minute (a rate limit of a
    request a minute each), known there or not: the minute's first pick looks at every
    one's budget, the rest at none, and each goes at once through one the site has not
    turned away. What ends the minute's word: a proxy new to the pool, or a new minute,
    whose picks spread over the pool again."""
    from endpoint.router import choose

    checked = _Calls(monkeypatch, "_within_budget")
    monkeypatch.setattr(choose, "EXPLORE", 0.0)
    for known in (False, True):
        pool, ups = _pool(2_000)
        for up in ups:
            up.tolerated["shop.example"] = 1
            up.site_uses["shop.example"] = (1, 1)
            if known:
                pool.got_through(up, "shop.example")
        checked.count = 0
        picks = [
            pool.pick(Want(consumer="shop"), tunnel=False, now=60.0 + i / 100, site="shop.example")
            for i in range(300)
        ]
        assert all(picks) and len({p.key for p in picks if p}) > 100, known
        # Before: 2,000 budget checks a pick (4,000 where every proxy is known).
        assert checked.count <= 3 * 2 * 2_000, (known, checked.count)

        pool.replace([*ups, Upstream("46.0.0.1", 8080, "http")])  # within its budget
        fresh = pool.upstreams[("46.0.0.1", 8080)]
        fresh.tolerated["shop.example"] = 1
        want = Want(consumer="shop")
        assert pool.pick(want, tunnel=False, now=61.0, site="shop.example") is fresh
        assert pool.pick(want, tunnel=False, now=62.0, site="shop.example")  # it too spent
        later = [
            pool.pick(Want(consumer="shop"), tunnel=False, now=120.0, site="shop.example")
            for _ in range(300)
        ]
        assert max(up.site_uses["shop.example"] for up in later if up) == (2, 1), known


def test_where_a_site_closed_every_proxy_its_picks_look_at_them_once_until_one_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A site that turned away every one of 2,000 proxies (the fleet's word), or paced
    them all: the first pick looks at the pool, the rest answer none at once (sticky
    sessions too), where each used to walk it three times. None is not remembered
    where only the pick's own left-out ones are open; and the picks find proxies again
    once one gets through there, or once the soonest is back (a later, shorter pace
    does not shorten a longer one)."""
    from endpoint.router import choose
    from events.sites import BLOCKED, THROUGH

    looked = _Calls(monkeypatch, "_open")
    pool, ups = _pool(2_000)
    pool.heard([(u.ip, u.port, "wall.example", BLOCKED) for u in ups], now=0.0)
    logins = [Want(consumer="shop"), Want(consumer="shop", session="a1")]
    looked.count = 0
    picks = [
        pool.pick(logins[i % 2], tunnel=False, now=1.0 + i, site="wall.example") for i in range(300)
    ]
    assert picks == [None] * 300
    assert looked.count <= 4 * 2_000, looked.count  # before: 7,000 a pick
    pool.heard([(ups[7].ip, ups[7].port, "wall.example", THROUGH)], now=301.0)
    assert pool.pick(logins[0], tunnel=False, now=302.0, site="wall.example") is ups[7]
    pool.turned_away(ups[7], "wall.example", now=302.0)
    assert pool.pick(logins[0], tunnel=False, now=303.0, site="wall.example") is None
    pool.got_through(ups[7], "wall.example")  # a request under way through it got through
    assert pool.pick(logins[0], tunnel=False, now=304.0, site="wall.example") is ups[7]
    pool.turned_away(ups[7], "wall.example", now=304.0)
    assert pool.pick(logins[0], tunnel=False, now=305.0, site="wall.example") is None
    back = pool.pick(logins[0], tunnel=False, now=choose.SITE_BLOCK_S + 1, site="wall.example")
    assert back is not None and back is not ups[7]  # back when its block ends: not this one

    pool, ups = _pool(2_000)  # all but one turned away, and that one left out
    for up in ups[1:]:
        pool.turned_away(up, "strict.example", now=0.0)
    left_out = frozenset({ups[0].key})
    want = Want(consumer="shop")
    assert pool.pick(want, tunnel=False, now=1.0, exclude=left_out, site="strict.example") is None
    assert pool.pick(want, tunnel=False, now=2.0, site="strict.example") is ups[0]

    pool, ups = _pool(2_000)  # every one paced: two minutes, and one of them a second too
    for up in ups:
        choose.pace(up, "paced.example", 0.0, 120.0)
    choose.pace(ups[3], "paced.example", 1.0, 1.0)
    assert pool.pick(want, tunnel=False, now=5.0, site="paced.example") is None
    assert pool.pick(want, tunnel=False, now=119.0, site="paced.example") is None
    assert pool.pick(want, tunnel=False, now=121.0, site="paced.example") is not None


def test_a_consumer_whose_refusals_cover_the_pool_keeps_its_latest_and_picks_cheaply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer met a refusal at its site through each of 2,000 proxies: its share
    went for everyone, and of the rest its own picks leave out only the latest
    ``PRIVATE_MARKS`` (one marked again counts as new), so its picks go at once through
    one it did not leave out, where each walked the pool three times to find none
    (and its marks grew without end); another consumer's picks are untouched."""
    from endpoint.router import choose, shares
    from endpoint.router.router import Router

    looked = _Calls(monkeypatch, "_open")
    pool, ups = _pool(2_000)
    router = Router(pool, lambda name, token: asyncio.sleep(0, True))
    for n, up in enumerate(ups):
        router.charges.turned_away("mallory", up, "evil.example", 1.0 + n / 1_000)
    shared = {u.key for u in ups if "evil.example" in u.turned_away}
    assert len(shared) == max(shares.MIN_MARKS, int(shares.SHARE * 2_000))
    router.charges.turned_away("mallory", ups[-shares.PRIVATE_MARKS], "evil.example", 4.0)  # again
    router.charges.turned_away("mallory", ups[0], "evil.example", 4.0)  # shared: now its own too
    own = router.charges.left_out("mallory", "evil.example", 5.0)
    latest = {u.key for u in ups[-shares.PRIVATE_MARKS :]} - {ups[-shares.PRIVATE_MARKS + 1].key}
    assert own == latest | {ups[0].key}
    looked.count = 0
    picks = [
        pool.pick(Want("mallory"), tunnel=False, now=5.0, exclude=own, site="evil.example")
        for _ in range(100)
    ]
    assert all(picks) and not {p.key for p in picks if p} & (own | shared)
    assert looked.count <= 100 * 4 * choose.SAMPLE, (
        looked.count
    )  # before: the pool not left out, 3 times
    alice = {
        p.key
        for _ in range(300)
        if (p := pool.pick(Want("alice"), tunnel=False, now=5.0, site="evil.example"))
    }
    assert alice & own and not alice & shared
