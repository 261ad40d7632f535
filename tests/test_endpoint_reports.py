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
    router.failed(shop, "t", up, "connect: burst")
    router.failed(shop, "t", up, "connect: again")  # nothing checked since: not said again
    assert said == [("9.9.9.1", False)]
    pool.replace([Upstream("9.9.9.1", 80, "http", last_seen=2_000)])  # a check passed
    assert pool.upstreams[("9.9.9.1", 80)] is up and up.strikes == 2
    router.failed(shop, "t", up, "connect: dead now")
    router.failed(shop, "t", up, "connect: still")
    assert said == [("9.9.9.1", False)] * 2
