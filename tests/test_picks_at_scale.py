"""A pick at scale (endpoint/router/choose.py): what a pick looks at stays a sample
whatever the pool's size, and what it samples follows what the endpoint learned."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import Want


def test_a_pick_at_a_busy_site_looks_at_a_sample_and_follows_what_it_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where every one of 2,000 proxies is known to get through, a pick (an exploring one
    too) looks at a sample of them, not at the pool; and what it picks from follows what
    was learned since: a proxy that lost its standing is not among the known, a new one
    is, and a new pool's upstreams replace the old ones."""
    walked = 0  # upstreams a pick went through one by one

    class Walked(list[Upstream]):
        def __iter__(self) -> Iterator[Upstream]:
            nonlocal walked
            walked += len(self)
            return super().__iter__()

    matching = Pool._matching
    monkeypatch.setattr(Pool, "_matching", lambda *args: Walked(matching(*args)))
    pool = Pool(rng=random.Random(3))
    pool.replace(Upstream(f"45.0.{n // 250}.{n % 250}", 8080, "http") for n in range(2_000))
    ups = sorted(pool.upstreams.values(), key=lambda u: u.key)
    for up in ups:
        pool.got_through(up, "shop.example")
    picks = [
        pool.pick(Want(consumer="shop"), tunnel=False, now=1.0, site="shop.example")
        for _ in range(400)
    ]
    assert all(picks) and len({p.key for p in picks if p}) > 100
    assert walked == 0, walked  # each exploring pick walked all 2,000

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
    pool.replace(Upstream(u.ip, u.port, "http") for u in ups[1:3])
    assert standing.known("shop.example") == ups[1:3]


def test_ppf_bench_pick_measures_each_size_in_both_trees_and_refuses_what_it_cannot_measure() -> (
    None
):
    """`ppf bench pick --versus DIR`: the CPU a pick for each pool size in this tree and in
    DIR (here the same tree), each measured in a process of its own; sizes it cannot
    measure (none, or too few proxies for the picks in one minute) are refused."""
    from pathlib import Path

    from ops.bench.options import Pick
    from ops.bench.pick import bench_pick

    here = Path(__file__).resolve().parents[1]
    out = bench_pick(Pick(sizes="50,500", picks=500, runs=2, versus=here))
    for size in (50, 500):
        row = out[f"pool_{size}"]
        assert len(row["by_run"]) == len(row["versus_by_run"]) == 2, row
        assert row["us"] > 0 and row["versus_us"] > 0 and row["x"] > 0, row
    with pytest.raises(SystemExit, match="--sizes"):
        bench_pick(Pick(sizes="0"))
    with pytest.raises(SystemExit, match="--picks"):
        bench_pick(Pick(sizes="10", picks=5_000))
