"""Routing by site (endpoint/router/choose.py, endpoint/router/verdicts.py): the endpoint
learns from its consumers' traffic which proxies a site turns away, tries a turned-away
request through another proxy before the client sees it, and sends later requests for
that site through proxies that get through, without counting a block as the proxy's
failure."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import Want
from ops.lab.testbed import ProxyLab
from ops.nats.server import free_port
from tests.test_forward import AUTH, TOKEN, _endpoint, _get, _raw

Handler = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def _serving(host: str, page: Handler) -> AsyncIterator[str]:
    """A site on ``host`` whose root ``page`` answers; its ``host:port``."""
    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port(host)
    await web.TCPSite(runner, host, port).start()
    try:
        yield f"{host}:{port}"
    finally:
        await runner.cleanup()


def _site(host: str, refused: str) -> contextlib.AbstractAsyncContextManager[str]:
    """A site on ``host`` that turns away requests from the exit ``refused`` (403 and a
    block page) and serves its page to every other exit."""

    async def page(request: web.Request) -> web.Response:
        if request.remote == refused:
            return web.Response(status=403, text="blocked: your network is listed")
        return web.Response(text=f"the page of {host}")

    return _serving(host, page)


async def _ask(port: int, site: str, times: int) -> list[bytes]:
    """``times`` GETs of ``site``'s page, one connection each; their status lines."""
    out = []
    for _ in range(times):
        (answer,) = await _raw(port, _get(site, "/"), 1)
        out.append(answer.split(b"\r\n", 1)[0])
    return out


async def test_each_site_learns_which_proxies_get_through_and_is_served_its_page(
    lab: ProxyLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sites, each turning away one of two proxies' exits: once the endpoint has seen
    the page of each through the other proxy, every request gets the page (a 403 met on
    the way, when the known proxy has used its budget, is tried through another proxy
    before the client sees anything), and neither proxy counts as failed."""
    from endpoint.router import choose

    monkeypatch.setattr(choose, "SITE_BUDGET", 2)  # so the others are tried too
    exits = {p.name: p.exit_ip for p in lab.proxies}
    async with (
        _site("127.0.0.10", refused=exits["squid"]) as a,
        _site("127.0.0.11", refused=exits["tinyproxy-elite"]) as b,
        _endpoint(lab, "squid", "tinyproxy-elite") as relay,
    ):
        port = relay.port  # type: ignore[attr-defined]
        for _ in range(10):  # learning: until each site's page came through once
            await _ask(port, a, 1)
            await _ask(port, b, 1)
            through = relay.pool.standing.through
            if through.get("127.0.0.10") and through.get("127.0.0.11"):
                break
        served = await _ask(port, a, 20) + await _ask(port, b, 20)
    assert served == [b"HTTP/1.1 200 OK"] * 40
    by_port = {up.port: up for up in relay.pool.upstreams.values()}
    squid = next(up for up in by_port.values() if up.port == _port(lab, "squid"))
    tiny = next(up for up in by_port.values() if up.port == _port(lab, "tinyproxy-elite"))
    assert set(relay.pool.standing.through["127.0.0.10"]) == {tiny.key}
    assert set(relay.pool.standing.through["127.0.0.11"]) == {squid.key}
    assert "127.0.0.10" in squid.turned_away and "127.0.0.11" in tiny.turned_away
    assert squid.strikes == tiny.strikes == 0  # a block is not the proxy's failure
    assert relay.outcomes.counts.get("turned_away", 0) >= 1


def _port(lab: ProxyLab, name: str) -> int:
    return next(p.port for p in lab.proxies if p.name == name)


def _want() -> Want:
    return Want(consumer="shop")


def test_a_pick_for_a_site_prefers_known_proxies_within_their_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Known to get through first, but for a share of plain HTTP that explores the
    proxies with no standing there; never one turned away lately; unknown ones once the
    known have used their budget for the minute; tunnels never explore; another site is
    not affected. (One known proxy prefers here: the exits rule has its own test.)"""
    from endpoint.router import choose, standing

    monkeypatch.setattr(standing, "MIN_EXITS", 1)

    pool = Pool(rng=random.Random(7))  # a pinned draw: the same picks every run
    pool.replace(Upstream(f"45.0.0.{n}", 8080, "http", latency_ms=50) for n in range(1, 9))
    ups = sorted(pool.upstreams.values(), key=lambda u: u.key)
    pool.got_through(ups[0], "shop.example")
    pool.turned_away(ups[1], "shop.example", now=0.0)
    picks = [pool.pick(_want(), tunnel=False, now=1.0, site="shop.example") for _ in range(100)]
    keys = [p.key for p in picks if p]
    explored = [k for k in keys if k != ups[0].key]
    assert len(keys) == 100 and ups[1].key not in keys
    assert 0 < len(explored) <= 2 * standing.EXPLORE * 100, len(explored)
    assert ups[0].site_uses["shop.example"] == (0, 100 - len(explored))
    socks = Upstream("45.0.0.9", 1080, "socks5", latency_ms=50)
    pool.replace([*pool.upstreams.values(), socks])
    pool.got_through(pool.upstreams[socks.key], "shop.example")
    tunnels = [pool.pick(_want(), tunnel=True, now=1.0, site="shop.example") for _ in range(30)]
    assert {t.key for t in tunnels if t} == {socks.key}  # the known one: no exploring
    later = [
        pool.pick(_want(), tunnel=False, now=2.0, site="shop.example")
        for _ in range(choose.SITE_BUDGET)
    ]
    assert ups[1].key not in {p.key for p in later if p}
    assert {p.key for p in later if p} - {ups[0].key}  # past its budget, others take it
    elsewhere = [pool.pick(_want(), tunnel=False, now=2.0, site="other.example") for _ in range(80)]
    assert ups[1].key in {p.key for p in elsewhere if p}  # one site's block, not the others'
    assert pool.pick(_want(), tunnel=False, now=1.0 + choose.SITE_BLOCK_S, site="shop.example")


@pytest.mark.parametrize("status, location, said", [
    (403, "", "blocked"), (302, "https://www.google.com/sorry/index", "blocked"),
    (302, "/search", "none"), (200, "", "none"), (404, "", "none"), (502, "", "none"),
    (429, "", "paced"),
])  # fmt: skip
def test_a_heads_verdict_reads_a_rule_or_what_other_proxies_got(
    status: int, location: str, said: str
) -> None:
    """By a built-in rule, a block status or a redirect to a block path turns a request
    away at its head; a site without a rule turns it away by 403 (or a proxy's 502-504:
    it could not get the page) only where another proxy got its page, and never by a
    missing page. A 429 paces, with a rule or without, other proxies' pages or not."""
    from endpoint.router.verdicts import head_verdict_of, rule_of

    pool = Pool()
    google = rule_of(pool, "google.com")
    assert head_verdict_of(pool, "google.com", google, status, location) == said
    pool.replace([Upstream("45.0.0.1", 8080, "http")])  # a standing is the pool's own's
    up = pool.upstreams[("45.0.0.1", 8080)]
    assert rule_of(pool, "shop.example") is None
    if status != 429:
        assert head_verdict_of(pool, "shop.example", None, status, "") == "none"
    if status == 429:
        assert head_verdict_of(pool, "shop.example", None, status, "") == "paced"
    pool.got_through(up, "shop.example")
    expected = {403: "blocked", 502: "blocked", 429: "paced"}.get(status, "none")
    assert head_verdict_of(pool, "shop.example", None, status, "") == expected


def test_a_redirect_to_a_captcha_is_a_block_on_any_site_with_or_without_others() -> None:
    """A redirect whose path names a block page (a captcha, a challenge) is turned away
    on a site without rules, before any proxy got its page; another redirect is not."""
    from endpoint.router.verdicts import head_verdict_of

    pool = Pool()
    for location in ("/captcha?return=/x", "https://shop.example/Challenge/1"):
        assert head_verdict_of(pool, "shop.example", None, 302, location) == "blocked"
    assert head_verdict_of(pool, "shop.example", None, 301, "https://shop.example/") == "none"


def test_a_connection_closed_by_one_site_is_its_block_by_two_the_proxys_failure() -> None:
    """A fresh connection that ended before any answer is the site's refusal while it is
    the only site that did so lately (the proxy stays in for others); a second site
    doing so makes it the proxy's failure, for its caller to count. The caller marks a
    refusal (through the consumer's share, router/shares.py)."""
    from endpoint.router import choose
    from endpoint.router.router import Router

    pool = Pool()
    up = Upstream("45.0.0.1", 8080, "http")
    pool.replace([up])
    router = Router(pool, lambda name, token: asyncio.sleep(0, True))
    for now in (0.0, 1.0):  # the same site again: its block
        assert pool.standing.closed_on(up, "shop.example", now=now)
        router.charges.turned_away("shop", up, "shop.example", now)
    assert up.turned_away["shop.example"] == 1.0 + choose.SITE_BLOCK_S
    assert not pool.standing.closed_on(up, "news.example", now=2.0)
    assert "news.example" not in up.turned_away
    assert pool.standing.closed_on(up, "news.example", now=2.0 + choose.SITE_BLOCK_S)  # long after


async def test_the_sites_answer_reaches_the_client_when_no_other_proxy_is_left(
    lab: ProxyLab,
) -> None:
    """With every proxy turned away, the consumer gets the site's own answer (not a 502
    of the endpoint's), and the proxy stays in the pool."""
    exits = {p.name: p.exit_ip for p in lab.proxies}
    async with (
        _site("127.0.0.12", refused=exits["squid"]) as a,
        _endpoint(lab, "squid") as relay,
    ):
        port = relay.port  # type: ignore[attr-defined]
        got = await _ask(port, a, 3)
        await asyncio.sleep(0)
    assert got == [b"HTTP/1.1 403 Forbidden"] * 3
    assert all(up.strikes == 0 for up in relay.pool.upstreams.values())


async def test_an_operators_rule_turns_a_captcha_redirect_away_at_once(lab: ProxyLab) -> None:
    """With the operator's rule for a site (a redirect to /captcha is a block), the first
    request squid's exit is redirected on is tried through another proxy before anything
    reaches the client, before any page of the site has been seen."""
    from events.sites import SiteRule

    exits = {p.name: p.exit_ip for p in lab.proxies}

    async def page(request: web.Request) -> web.Response:
        if request.remote == exits["squid"]:
            raise web.HTTPFound("/captcha?from=listed")
        return web.Response(text="the shop")

    async with (
        _serving("127.0.0.15", page) as site,
        _endpoint(lab, "squid", "tinyproxy-elite") as relay,
    ):
        relay.pool.rules = (SiteRule(site="127.0.0.15", redirects=("/captcha",)),)
        login = b"Proxy-Authorization: Basic " + base64.b64encode(
            f"shop-strategy-roundrobin:{TOKEN}".encode()
        )
        got = []
        for _ in range(4):
            request = _get(site, "/").replace(AUTH, login + b"\r\n")
            (answer,) = await _raw(relay.port, request, 1)  # type: ignore[attr-defined]
            got.append(answer.split(b"\r\n", 1)[0])
    assert got == [b"HTTP/1.1 200 OK"] * 4
    assert relay.outcomes.counts.get("turned_away", 0) >= 1


async def test_a_round_of_site_verdicts_in_flight_at_a_stop_is_sent_and_counted() -> None:
    """The endpoint stops while its round of site verdicts is on its way to a slow
    gateway: the round ends (it was cancelled mid-send before, its taken cells lost and
    counted nowhere), and the stop's own flush waits for it, then sends what came after."""
    from aiohttp.test_utils import TestServer

    from endpoint.feed import Feed

    posting, rounds = asyncio.Event(), []

    async def events(request: web.Request) -> web.Response:
        posting.set()
        await asyncio.sleep(0.5)
        rounds.append([len(e["results"]) for e in (await request.json())["events"]])
        return web.json_response({"accepted": 1})

    app = web.Application()
    app.router.add_post("/v1/events", events)
    gateway = TestServer(app)
    await gateway.start_server()
    pool = Pool()
    feed = Feed([str(gateway.make_url("")).rstrip("/")], pool, identity=("edge", "t"))
    feed.sites_every_s = 0.05
    try:
        await feed.start()
        pool.tally.cells[("8.8.8.8", 80, "example.com")] = [1, 0]
        await asyncio.wait_for(posting.wait(), 5)
        pool.tally.cells[("8.8.4.4", 80, "example.com")] = [0, 1]  # after the round began
        await feed.stop()
    finally:
        await gateway.close()
    assert rounds == [[1], [1]]
    assert (feed.sites_sent, feed.sites_dropped) == (2, 0)


def test_the_endpoints_map_of_sites_forgets_the_least_recent_not_the_newest() -> None:
    """Past MAX_SITES sites known to get through, the one least recently asked for or
    learned goes: before, a full map learned no new site for good (a pool that had run a
    while stopped learning)."""
    from endpoint.router import standing

    pool = Pool(rng=random.Random(1))
    pool.replace([Upstream("8.8.8.8", 80, "http")])
    (up,) = pool.upstreams.values()
    want = Want("me")
    for n in range(standing.MAX_SITES):
        pool.got_through(up, f"s{n}.example")
    assert pool.pick(want, tunnel=False, now=0.0, site="s0.example") is up  # asked: recent
    pool.got_through(up, "new.example")
    assert len(pool.standing.through) == standing.MAX_SITES
    assert "new.example" in pool.standing.through and "s0.example" in pool.standing.through
    assert "s1.example" not in pool.standing.through  # the least recent went


def test_a_rate_limit_paces_the_proxy_for_that_site_for_the_time_asked_never_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 through a proxy known to get through: that proxy is not picked for that site
    for its Retry-After (60 s when unsaid), is picked for other sites meanwhile, keeps
    its standing there afterwards, and from then on takes no more requests a minute
    there than the site let through before; nothing of it is a block for the log. (No
    exploring here, and no exits rule: their own tests have them.)"""
    from endpoint.router import choose, standing
    from endpoint.router.verdicts import retry_after_s

    monkeypatch.setattr(choose, "EXPLORE", 0.0)
    monkeypatch.setattr(standing, "MIN_EXITS", 1)  # one known proxy prefers here

    pool = Pool(rng=random.Random(1))
    fast, other = Upstream("8.8.8.8", 80, "http"), Upstream("8.8.4.4", 80, "http")
    pool.replace([fast, other])
    fast, other = pool.upstreams[fast.key], pool.upstreams[other.key]
    pool.got_through(fast, "shop.example")
    pool.tally.take(0.0)
    for _ in range(5):  # five requests this minute, then the 429
        assert pool.pick(_want(), tunnel=False, now=60.0, site="shop.example") is fast
    choose.pace(fast, "shop.example", 60.0, retry_after_s(b"120"))
    picks = [pool.pick(_want(), tunnel=False, now=61.0, site="shop.example") for _ in range(20)]
    assert all(p is other for p in picks)
    elsewhere = [pool.pick(_want(), tunnel=False, now=61.0, site="news.example") for _ in range(40)]
    assert any(p is fast for p in elsewhere)
    assert pool.standing.through["shop.example"] == {fast.key: fast}  # still known to get through
    assert pool.tally.take(0.0) == ({}, 0)  # not a verdict for the log
    later = [pool.pick(_want(), tunnel=False, now=240.0, site="shop.example") for _ in range(6)]
    taken = sum(p is fast for p in later)
    assert taken == fast.tolerated["shop.example"] == 4  # then the one not known there
    assert retry_after_s(b"Wed, 21 Oct 2015 07:28:00 GMT") is None
    choose.pace(other, "news.example", 0.0, None)
    assert other.paced["news.example"] == choose.PACE_S


def test_one_consumers_refusals_act_for_everyone_only_within_its_share() -> None:
    """A consumer marks proxies turned away at a site for everyone (and the log) up to
    its share of the pool (5 %, at least 2) in 30 minutes; past it, a refusal it meets
    leaves the proxy out of its own picks there, never out of another consumer's, and
    is not said to the fleet."""
    from endpoint.router import choose, shares
    from endpoint.router.router import Router

    pool = Pool(rng=random.Random(1))
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 41)])
    ups = [pool.upstreams[k] for k in sorted(pool.upstreams)]
    router = Router(pool, lambda name, token: asyncio.sleep(0, True))
    allowed = max(shares.MIN_MARKS, int(shares.SHARE * 40))
    for up in ups[:10]:  # a consumer drawing refusals on purpose
        router.charges.turned_away("mallory", up, "shop.example", 10.0)
    marked = {up.key for up in ups if "shop.example" in up.turned_away}
    assert marked == {up.key for up in ups[:allowed]}
    assert pool.tally.cells.keys() == {(*key, "shop.example") for key in marked}
    own = router.charges.left_out("mallory", "shop.example", 11.0)
    assert own == {up.key for up in ups[allowed:10]}
    assert router.charges.left_out("alice", "shop.example", 11.0) == frozenset()
    alice = {
        p.key
        for _ in range(200)
        if (p := pool.pick(Want("alice"), tunnel=False, now=11.0, site="shop.example"))
    }
    assert own <= alice and not (marked & alice)  # hers to pick, but what was shared
    later = 10.0 + choose.SITE_BLOCK_S + 1
    assert router.charges.left_out("mallory", "shop.example", later) == frozenset()
    router.charges.turned_away("mallory", ups[20], "shop.example", later)  # its share came back
    assert "shop.example" in ups[20].turned_away


async def _squid_listed(
    lab: ProxyLab, host: str, listed: str, real: str, asks: int
) -> tuple[list[tuple[bytes, ...]], Any, dict[Any, Any]]:
    """A site on ``host`` answering squid's exit the HTML ``listed`` and every other
    exit ``real``, asked ``asks`` times through an endpoint of squid and tinyproxy: the
    answers, squid's upstream, and the upstreams known to get through to the site."""
    exits = {p.name: p.exit_ip for p in lab.proxies}

    async def page(request: web.Request) -> web.Response:
        text = listed if request.remote == exits["squid"] else real
        return web.Response(text=text, content_type="text/html")

    async with _serving(host, page) as site, _endpoint(lab, "squid", "tinyproxy-elite") as relay:
        port = relay.port  # type: ignore[attr-defined]
        pages = [await _raw(port, _get(site, "/"), 1) for _ in range(asks)]
        squid = next(u for u in relay.pool.upstreams.values() if u.port == _port(lab, "squid"))
        return pages, squid, dict(relay.pool.standing.through.get(host, {}))


async def test_a_200_block_page_is_held_back_and_the_request_tried_elsewhere(
    lab: ProxyLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site answering a listed exit a 200 challenge page (a vendor's sign, no rule):
    the endpoint holds an HTML answer back until its page is read, so the consumer gets
    the real page every time, the first included, and the challenging exit's proxy is
    learned as turned away, not as getting through (before, the 200 went to the client
    and the proxy serving it was preferred)."""
    from endpoint.router import choose

    monkeypatch.setattr(choose, "SITE_BUDGET", 1)  # so the challenging proxy is tried too
    challenge = (
        "<html><head><title>Just a moment...</title></head><body><script>"
        "window._cf_chl_opt={cType:'managed'};</script></body></html>"
    )

    real = "<html><title>Shop</title>the real page</html>"
    pages, squid, through = await _squid_listed(lab, "127.0.0.13", challenge, real, 12)
    assert all(b"the real page" in answer for (answer,) in pages), pages
    assert "127.0.0.13" in squid.turned_away
    assert squid.key not in through


async def test_a_short_page_with_no_sign_is_told_from_the_page_by_the_other_proxies(
    lab: ProxyLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site answering a listed exit a 200 page with no vendor's sign and no block word
    (a captcha of its own) and no rule for it: once another proxy brought the real page,
    the short page reads as the block (its proxy loses its standing at once, and a
    request that meets it is tried elsewhere), so every request from the first real
    page on gets the real page. Before, any 2xx read as ``through`` and the captcha's proxy was
    preferred."""
    from endpoint.router import choose

    monkeypatch.setattr(choose, "SITE_BUDGET", 1)  # so the captcha's proxy is tried too
    real = "<html><head><title>Shop</title></head><body>" + "<p>the real page</p>" * 300
    wait = "<html><head><title>One moment</title></head><body>type the letters</body></html>"
    pages, squid, through = await _squid_listed(lab, "127.0.0.16", wait, real + "</body>", 14)
    # From the first real page on (which proxy comes first is the pick's), every answer
    # is the real page: the short one is known as the block from then.
    first = next(i for i, (answer,) in enumerate(pages) if b"the real page" in answer)
    assert first < 10 and all(b"the real page" in answer for (answer,) in pages[first:]), pages
    assert squid.key not in through and len(through) == 1


async def test_a_long_page_titled_with_a_blocks_words_is_the_sites_own(lab: ProxyLab) -> None:
    """A real page of 80 KiB whose title has a block's words, read while still coming
    (its first 16 KiB held back): not a short page, so not a block; it goes to the
    client at once and its proxy keeps its standing (read by its first bytes' size, it
    was taken for a block page)."""
    article = "<p>" + "A long article about why captcha pages annoy everyone. " * 1500 + "</p>"
    real = f"<html><head><title>Why captcha pages annoy everyone</title></head>{article}</html>"

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=real, content_type="text/html")

    async with _serving("127.0.0.15", page) as site, _endpoint(lab, "tinyproxy-elite") as relay:
        (answer,) = await _raw(relay.port, _get(site, "/"), 1)  # type: ignore[attr-defined]
        (tiny,) = relay.pool.upstreams.values()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"</p></html>")
    assert "127.0.0.15" not in tiny.turned_away
    assert relay.outcomes.counts.get("turned_away", 0) == 0


async def test_a_block_page_with_no_other_proxy_left_reaches_the_client_not_a_503(
    lab: ProxyLab,
) -> None:
    """A held answer read as a block, and no other proxy to try: the client gets what the
    site said through the last one (the challenge page), not the endpoint's 503."""
    challenge = "<html><head><title>Just a moment...</title></head><body>wait</body></html>"

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=challenge, content_type="text/html")

    async with _serving("127.0.0.16", page) as site, _endpoint(lab, "squid") as relay:
        (answer,) = await _raw(relay.port, _get(site, "/"), 1)  # type: ignore[attr-defined]
        (squid,) = relay.pool.upstreams.values()
    assert answer.startswith(b"HTTP/1.1 200") and b"Just a moment" in answer, answer[:200]
    assert "127.0.0.16" in squid.turned_away
