"""A site tells a page from its block whichever comes first on a URL: a block read
beside a page another proxy got there, by its page or by its head, splits the site as a
page read beside the block does (endpoint/router/pages.py ``told_blocked``), so a captcha
that looks like a page, or a redirect to an interstitial, is the block on every URL of
the site from then on."""

from __future__ import annotations

import random

from endpoint.link.request import Request
from endpoint.link.uplink import UpLink
from endpoint.link.upstream import Upstream
from endpoint.router.choose import Pool
from endpoint.router.login import parse_login
from endpoint.router.router import Router
from endpoint.router.verdicts import ALIKE, head_verdict_of, read_answer
from events.pages import readable
from events.sites import BLOCKED, NONE, Answer

SITE = "shop.example"
REAL = b"<html><head><title>Shop - Spring sale</title></head><body>" + b"<p>goods</p>" * 600
WAIT = b"<html><head><title>One moment</title></head><body><form>type it</form></body></html>"
DENIED = b"<html><title>Access denied</title>45.0.0.1 is not allowed here.</html>"


def _pool() -> tuple[Pool, list[Upstream]]:
    pool = Pool(rng=random.Random(1), upstreams={})
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 9)])
    return pool, list(pool.upstreams.values())


def _answered(
    pool: Pool, up: Upstream, url: bytes, page: bytes, status: int = 200, location: str = ""
) -> tuple[str, set[tuple[str, int]]]:
    """``page`` through ``up`` to ``url``, read and learned as router/forwarding.py does."""
    link = UpLink(up, True, (), 1.0)
    link.status, link.location = status, location
    link.seen, link.size = bytearray(page), len(page)
    said, told = read_answer(pool, SITE, None, link, url)
    if said == ALIKE:
        pool.got_through(up, SITE, alike_at=1.0)
    if told:
        pool.standing.lose(SITE, told)
    return said, told


def test_a_captcha_after_the_page_on_its_url_splits_the_site() -> None:
    """Two captcha pages alike on one URL give their proxies standing (nothing tells them
    yet); a page on another URL, then a captcha beside it there: the captcha is the
    block, the site splits, the two proxies whose answers alike were of its class lose
    their standing, and the captcha on a URL asked the first time is the block at once.
    Before, only a page coming after the captcha split the site: in ``test_sites_box``
    the first split came 13-18 s into its 20 s of learning (a URL's second plain-HTTP
    visit is 13 s in), and a CI run passed four captchas to the consumer after it."""
    pool, (a, b, c, d, e, *_) = _pool()
    one, two, three = (f"{SITE}:80 /page/{n}".encode() for n in (1, 2, 3))
    assert _answered(pool, a, two, WAIT) == (NONE, set())
    assert _answered(pool, b, two, WAIT) == (ALIKE, set())
    assert _answered(pool, c, one, REAL) == (NONE, set())
    assert not pool.pages.splits(SITE)
    assert set(pool.standing.through[SITE]) == {b.key}
    said, told = _answered(pool, d, one, WAIT)  # the site's first split
    assert said == BLOCKED
    assert told == {a.key, b.key}, told  # not d: its caller turns it away
    wait = Answer(status=200, head=readable(WAIT, ""), size=len(WAIT))
    assert pool.pages.splits(SITE) and pool.pages.looks_blocked(SITE, wait)
    assert not pool.standing.through[SITE]
    assert _answered(pool, e, three, WAIT) == (BLOCKED, set())  # asked the first time


def test_a_refusal_or_a_block_page_beside_the_page_splits_nothing() -> None:
    """A 403 and a block page by its signs are refusals, told by what they are: read
    beside the page they are the block, but no class of a page's, so the site is not
    split by them and a page alike on another URL still reads as one."""
    pool, (a, b, c, d, *_) = _pool()
    one, two = (f"{SITE}:80 /page/{n}".encode() for n in (1, 2))
    assert _answered(pool, a, one, REAL) == (NONE, set())
    assert _answered(pool, b, one, DENIED, status=403) == (BLOCKED, set())
    assert _answered(pool, c, one, DENIED) == (BLOCKED, set())  # a 200 with its signs
    assert not pool.pages.splits(SITE)
    assert _answered(pool, a, two, REAL)[0] == NONE
    assert _answered(pool, d, two, REAL)[0] == ALIKE


def test_a_redirect_told_at_its_head_beside_the_page_splits_the_site() -> None:
    """A site that sends the exits it turns away to an interstitial: a redirect read at
    its head beside a page another proxy got on its URL is the block, tried elsewhere,
    and splits the site, so a redirect there on a URL asked the first time is the block
    at its head too, and a proxy whose redirect elsewhere was read as nothing is turned
    away. Before, only a page read after the redirect split the site: in a run of
    ``test_sites_box`` under three busy CPUs its first split came 21.9 s in, after its 20
    s of learning, and two plain-HTTP requests followed the redirect to the interstitial."""

    async def login_ok(name: str, token: str) -> bool:
        return True

    pool, (a, b, c, d, *_) = _pool()
    router = Router(pool, login_ok)
    one, two, three = (f"{SITE}:80 /page/{n}".encode() for n in (1, 2, 3))

    def away(n: int) -> str:
        return f"/welcome?next=/page/{n}"

    def head(n: int, url: bytes, up: Upstream) -> str:
        return head_verdict_of(pool, SITE, None, 302, away(n), url, up.key)

    assert head(2, two, a) == NONE  # nothing to compare with: the client follows it
    assert _answered(pool, a, two, b"", status=302, location=away(2)) == (NONE, set())
    assert _answered(pool, b, one, REAL) == (NONE, set())
    assert head(1, one, c) == BLOCKED
    req = Request(b"GET", f"http://{SITE}/page/1".encode(), SITE, 80, site=SITE)
    router.refused(parse_login("shop"), "t", c, req, one, 302, away(1))
    assert pool.pages.splits(SITE)
    assert SITE in a.turned_away and SITE in c.turned_away and SITE not in b.turned_away
    assert head(3, three, d) == BLOCKED  # asked the first time
