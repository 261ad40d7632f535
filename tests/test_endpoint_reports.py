"""What the endpoint tells the log of a proxy's failures: the consumer's reports, each
one of its hourly budget, said once for one outstanding failure and again once a check
passed after it (endpoint/router/router.py ``failed``)."""

from __future__ import annotations

import random

from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import parse_login
from endpoint.router.router import Router


def test_a_failure_is_reported_again_once_a_check_passed_since_the_last_report() -> None:
    """A proxy's failures in a row go to the log once; but when a check passed after
    that report (the feed's row has a newer ``last_seen``), the checkers' queue no longer
    has it first, and its next failure goes to the log though no request worked between:
    a proxy whose one failure was a burst's, checked fine, then dead, was not reported
    again and was served dead for a fresh proxy's recheck interval."""
    said: list[tuple[str, bool]] = []

    async def login_ok(name: str, token: str) -> bool:
        return True

    def record(token: str, name: str, up: Upstream, ok: bool, ms: float, why: str) -> None:
        said.append((up.ip, ok))

    pool = Pool(rng=random.Random(1))
    pool.replace([Upstream("9.9.9.1", 80, "http", last_seen=1_000)])
    router = Router(pool, login_ok, record=record)
    up = pool.upstreams[("9.9.9.1", 80)]
    shop = parse_login("shop")
    router.charges.failed(shop, "t", up, "connect: burst")
    router.charges.failed(shop, "t", up, "connect: again")  # nothing checked since: not said again
    assert said == [("9.9.9.1", False)]
    pool.replace([Upstream("9.9.9.1", 80, "http", last_seen=2_000)])  # a check passed
    assert pool.upstreams[("9.9.9.1", 80)] is up and up.strikes == 2
    router.charges.failed(shop, "t", up, "connect: dead now")
    router.charges.failed(shop, "t", up, "connect: still")
    assert said == [("9.9.9.1", False)] * 2


def test_a_site_that_let_a_proxy_through_refusing_it_by_the_proxys_word_asks_the_checkers() -> None:
    """A 502-504, a close or a refused tunnel through a proxy the site let through lately
    is as likely the proxy's way out gone as the site turning it away: turned away for
    the site all the same, and said to the log as the consumer's report, once until a
    check passed. A dead proxy whose front still answered so was never met again there,
    never reported, and served dead for a fresh proxy's recheck interval (a CI run of
    the endpoint's box). A site's own 403, or a proxy it never let through, says nothing."""
    said: list[str] = []

    async def login_ok(name: str, token: str) -> bool:
        return True

    def record(token: str, name: str, up: Upstream, ok: bool, ms: float, why: str) -> None:
        said.append(why)

    pool = Pool(rng=random.Random(1))
    pool.replace(
        [Upstream("9.9.9.1", 80, "http", last_seen=1_000), Upstream("9.9.9.2", 80, "http")]
    )
    known, other = pool.upstreams[("9.9.9.1", 80)], pool.upstreams[("9.9.9.2", 80)]
    router = Router(pool, login_ok, record=record)
    shop = parse_login("shop")
    pool.got_through(known, "shop.example")
    # Never through:
    router.charges.refused_through(shop, "t", other, "shop.example", "refused: 502")
    pool.got_through(known, "shop.example")
    router.charges.refused_through(shop, "t", known, "shop.example", "")  # the site's own 403
    assert said == [] and known.turned_away.get("shop.example")
    pool.got_through(known, "shop.example")
    router.charges.refused_through(shop, "t", known, "shop.example", "refused: 502")
    assert said == ["refused: 502"]
    assert known.avoid_until == 0  # not the proxy's failure for the picks
    pool.got_through(known, "shop.example")
    # Nothing checked since:
    router.charges.refused_through(shop, "t", known, "shop.example", "closed")
    pool.replace([Upstream("9.9.9.1", 80, "http", last_seen=2_000)])  # a check passed
    pool.got_through(known, "shop.example")
    router.charges.refused_through(shop, "t", known, "shop.example", "closed")
    assert said == ["refused: 502", "closed"]
