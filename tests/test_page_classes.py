"""A site without a rule read by the classes of answers its request got through the
proxies (events/sites.py ``by_classes``, endpoint/router/pages.py): a block that looks
like a page is told from the page by what the other proxies got, never by how many got
which, and a split it cannot read says nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.sites import BLOCKED, NONE, THROUGH, Answer, by_classes, generic, same_class

REAL = Answer(
    status=200,
    head=b"<html><head><title>Shop - Spring sale</title></head><body>"
    + b"<p>the catalogue</p>" * 400
    + b"</body></html>",
    size=9_000,
)
# A captcha page with no vendor's sign and no block word in its title: what a site
# answers its listed exits with (the "200 captcha page without any rule").
WAIT = Answer(
    status=200,
    head=b"<html><head><title>One moment</title></head><body><form>type the letters"
    b"</form></body></html>",
    size=120,
)
# A redirect of listed exits to an interstitial whose path has no block word.
AWAY = Answer(status=302, location="https://shop.example/welcome-gate?r=1")


def test_a_short_page_beside_the_page_is_the_block_whatever_the_count() -> None:
    """The short, otherwise titled page is blocked and the page through, even where
    nine proxies got the short one and one the page: never by majority."""
    assert by_classes(WAIT, [REAL]) == BLOCKED
    assert by_classes(REAL, [WAIT]) == THROUGH
    assert by_classes(REAL, [WAIT] * 9) == THROUGH
    assert by_classes(WAIT, [WAIT] * 8 + [REAL]) == BLOCKED


def test_a_redirect_away_beside_the_page_is_the_block() -> None:
    """A redirect to a path with no block word, where other proxies got the page: the
    redirect is the block (before, any 3xx read as the site's own answer)."""
    assert by_classes(AWAY, [REAL]) == BLOCKED
    assert by_classes(REAL, [AWAY]) == THROUGH
    # Alone, nothing tells it: none, never through (the first answer may be the block).
    assert generic(AWAY, []) == NONE
    assert generic(AWAY, [AWAY]) == THROUGH  # every proxy sent away alike: the site's own


def test_a_split_it_cannot_read_says_nothing() -> None:
    """Two long pages titled otherwise (a test of two designs, say): neither is the
    block, so neither is ``through``: the split says ``none``."""
    other = Answer(status=200, head=b"<title>Shop - new look</title>" + b"x" * 8_000, size=8_100)
    assert by_classes(REAL, [other]) == NONE
    assert by_classes(other, [REAL]) == NONE


def test_answers_alike_are_one_class() -> None:
    """A page whose size moved a little, or the same short page, is the same class:
    ``through`` with nobody to tell it from."""
    again = Answer(status=200, head=REAL.head, size=REAL.size + 700)
    assert same_class(REAL, again)
    assert by_classes(again, [REAL]) == THROUGH
    assert not same_class(REAL, WAIT) and not same_class(REAL, AWAY)


def test_a_page_beside_the_endpoints_word_alone_is_none_and_beside_a_refusal_through() -> None:
    """The endpoint's word that some proxy got through (a 200 with no page read) is no
    class to compare with: a page beside it alone is ``none`` (the first captcha page
    of a URL read ``through`` by it). Another proxy's refusal of the same request makes
    the page ``through``, and a 403 beside a page is still the block."""
    assert generic(REAL, [Answer(status=200)]) == NONE
    assert generic(REAL, [Answer(status=403, head=b"<title>Forbidden</title>", size=90)]) == (
        THROUGH
    )
    assert generic(Answer(status=403), [REAL]) == BLOCKED


def test_a_vendors_page_beside_the_page_is_the_block() -> None:
    """A page with a vendor's sign is the block of a split whatever its size."""
    challenge = Answer(
        status=200,
        head=b"<title>Shop</title><script>window._cf_chl_opt={cType:'managed'}</script>"
        + b" " * 9_000,
        size=9_200,
    )
    assert generic(challenge, [REAL]) == BLOCKED
    assert by_classes(REAL, [challenge]) == THROUGH


def test_the_endpoint_keeps_a_class_small_and_a_vendors_page_as_a_refusal() -> None:
    """A URL's classes keep what comparing reads, not the page (a few hundred bytes for
    a 9 KB page); a proxy's latest answer decides its class, and a vendor's block page,
    a block by itself, puts it in the refusal's class (``REFUSED``), never in a class
    compared as a page."""
    from endpoint.router.pages import REFUSED, Pages

    pages, url = Pages(), b"shop.example:80 http://shop.example/"
    pages.add(url, ("45.0.0.1", 8080), REAL)
    pages.add(url, ("45.0.0.2", 8080), WAIT)
    (kept_real, kept_wait) = pages.classes(url)
    assert len(kept_real.head) < 100 and same_class(kept_real, REAL) and same_class(kept_wait, WAIT)
    assert by_classes(REAL, pages.others(url, ("45.0.0.1", 8080))) == THROUGH
    assert pages.got(url, WAIT) == {("45.0.0.2", 8080)}
    challenge = Answer(status=200, head=b"<script>window._cf_chl_opt={}</script>", size=9_000)
    pages.add(url, ("45.0.0.2", 8080), challenge)
    assert pages.got(url, WAIT) == set() and pages.classes(url) == [kept_real, REFUSED]
    assert pages.got(url, REFUSED) == {("45.0.0.2", 8080)}


def test_a_title_is_read_whatever_the_case_of_its_tag() -> None:
    """Older servers and appliances write ``<TITLE>``: a page and a block page of one
    size whose titles differ only there are two classes, and the block's words in its
    title tell it (read as one class, no title, the split said nothing)."""

    def old_style(title: bytes) -> Answer:
        page = b"<HTML><HEAD><TITLE>" + title + b"</TITLE></HEAD><BODY>" + b"x" * 3_000
        return Answer(status=200, head=page, size=40_000)

    page, block = old_style(b"Shop - Spring sale"), old_style(b"Verify you are a person")
    assert not same_class(page, block)
    assert by_classes(block, [page]) == BLOCKED
    assert by_classes(page, [block]) == THROUGH


def test_a_page_is_of_its_own_class_whatever_its_title() -> None:
    """A URL's class keeps what comparing reads of its answer, its title among it. Read
    again from what was kept, a title of more than 200 characters cut just after a word
    lost its last space, and a ``</TITLE>`` within a title cut it short: every answer of
    such a page (a shop's long product titles) was of another class than the one kept,
    so the page read as nothing through every proxy and was never learned."""
    from endpoint.router.pages import Pages
    from events.sites import compared

    long_title = b"<html><head><title>" + b"Word " * 60 + b"</title></head><body>"
    cut_title = b"<html><head><title>Sale</TITLE> of the day</title></head><body>"
    for head in (long_title, cut_title):
        page = head + b"<p>the item</p>" * 200
        first = Answer(status=200, head=page, size=9_000)
        again = Answer(status=200, head=page, size=9_100)
        assert same_class(compared(first), first)
        pages, url = Pages(), b"shop.example:80 http://shop.example/item"
        pages.add(url, ("45.0.0.1", 8080), first)
        assert by_classes(again, pages.others(url, ("45.0.0.2", 8080))) == THROUGH


_TITLE_PIECES = [b"</title>", b"</TITLE>", b" ", b"\t\n", b"Sale", b"w" * 60, b"<", b">"]


@settings(max_examples=300)
@given(
    st.sampled_from([b"<title>", b"<TITLE>", b"<title lang=en>"]),
    st.lists(st.sampled_from(_TITLE_PIECES) | st.binary(max_size=12), max_size=20),
)
def test_a_title_read_again_from_its_class_is_the_same(tag: bytes, pieces: list[bytes]) -> None:
    """What ``compared`` keeps of a page, read again, gives the page's title: whatever
    the tags' case, the spaces, or where the 200th byte falls."""
    from events.sites import compared, page_title

    head = b"<html><head>" + tag + b"".join(pieces) + b"</title></head><body>"
    answer = Answer(status=200, head=head, size=9_000)
    assert page_title(compared(answer).head) == page_title(head)


def test_a_sites_name_in_its_own_title_is_no_block_word() -> None:
    """A site whose name holds a block's word (``example-captcha.com``): its real page,
    titled with its name and short, is neither a block page by itself nor the block of
    a split beside its captcha page; the captcha page is. (Read as a block, the site's
    every real page was turned away: 0 % in ``ppf bench sites``.)"""
    from events.blockpages import block_sign

    page = b"<html><title>example-captcha.com</title><h1>the real page</h1>" + b"x" * 2_800
    real = Answer(status=200, head=page, size=len(page))
    captcha = Answer(
        status=200,
        head=b"<html><title>One more step</title><form>Are you a robot? captcha</form></html>",
        size=80,
    )
    assert block_sign(real.head, real.size) == ""
    assert by_classes(real, [captcha]) == THROUGH
    assert by_classes(captcha, [real]) == BLOCKED
    # A short page titled as a block is still one, host names aside.
    blocked = b"<html><title>Access denied | shop.example.net</title></html>"
    assert block_sign(blocked, len(blocked)) == "page"


def test_a_page_a_site_redirected_to_teaches_nothing_and_a_known_pick_spreads() -> None:
    """A client that follows a site's redirect to its interstitial asks a page every
    exit gets alike: the endpoint notes where the site sent it and learns nothing there
    (its answers read ``through`` had given the redirected proxies standing). And the
    picks of a site's known proxies go to the least used this minute, never piled on
    the fastest until the site rate-limits it."""
    import random

    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.login import Want
    from endpoint.router.pages import Pages

    pages = Pages()
    pages.sends_to("shop.example", "/welcome?next=/page/3")
    assert pages.sent_to("shop.example", b"shop.example:80 /welcome?next=/page/3")
    assert pages.sent_to(
        "shop.example", b"shop.example:80 http://shop.example/welcome?next=/page/3"
    )
    assert not pages.sent_to("shop.example", b"shop.example:80 /page/3")
    assert not pages.sent_to("other.example", b"other.example:80 /welcome?next=/page/3")

    pool = Pool(rng=random.Random(3), upstreams={})
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http", latency_ms=10.0 * n) for n in range(1, 5)])
    for up in pool.upstreams.values():
        pool.got_through(up, "shop.example")
    # Every proxy known: exploring finds none other, so each pick is a known one.
    picked = [
        pool.pick(Want("a"), tunnel=False, now=60.0 + i, site="shop.example") for i in range(8)
    ]
    counts = {up.key: picked.count(up) for up in pool.upstreams.values()}
    assert sorted(counts.values()) == [2, 2, 2, 2], counts


def test_answers_alike_are_held_from_the_log_and_unsaid_at_the_sites_first_split() -> None:
    """Most exits may be turned away, so two captcha pages alike read as the page until a
    real page tells them apart: for the picks at once, but held from the log, since a
    round sent before the split carried the block as ``through`` to the fleet (a
    ``works_on`` precision of 0.78 in a CI run). Held answers go to the log once their
    site went a minute without a split, and are unsaid at its first split; from then on
    answers alike (no block told beside them, no refusal) say ``none``; what was counted
    outright, a block or a page told from one, is kept."""
    from endpoint.link.upstream import Upstream
    from endpoint.router.tally import HOLD_S, Tally
    from events.sites import settled, tells

    assert settled(THROUGH, False, True, [WAIT]) == NONE
    assert settled(THROUGH, False, False, [WAIT]) == THROUGH  # a site never seen to split
    assert settled(THROUGH, False, True, [Answer(status=403)]) == THROUGH  # beside a refusal
    assert settled(THROUGH, True, True, [WAIT]) == THROUGH  # told from the block
    assert tells(REAL, [WAIT]) and not tells(WAIT, [REAL]) and not tells(WAIT, [WAIT])
    tally = Tally()
    a, b = Upstream("45.0.0.1", 8080, "http"), Upstream("45.0.0.2", 8080, "http")
    tally.hold(a, "shop.example", now=100.0)
    tally.count(b, "shop.example", 1)
    tally.count(a, "shop.example", 0)  # a page told from a block: outright
    tally.hold(a, "other.example", now=100.0)
    assert tally.take(now=100.0 + HOLD_S - 1) == (
        {("45.0.0.2", 8080, "shop.example"): [0, 1], ("45.0.0.1", 8080, "shop.example"): [1, 0]},
        0,
    )
    tally.hold(b, "shop.example", now=120.0)
    assert tally.unsay_alike("shop.example") == 2  # both held answers, before and after the take
    assert tally.take(now=100.0 + HOLD_S) == ({("45.0.0.1", 8080, "other.example"): [1, 0]}, 0)
    assert tally.take(now=1_000.0) == ({}, 0)


def test_known_proxies_are_preferred_only_once_they_come_out_of_two_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proxies known to get through all behind one exit (a NAT, one exit a site has not
    listed yet) are not preferred: the picks stay blind there until a proxy of another
    exit is known; then the known ones take the site's requests. (No exploring here.)"""
    import random

    from endpoint.link.upstream import Upstream
    from endpoint.router import choose
    from endpoint.router.choose import Pool
    from endpoint.router.login import Want

    monkeypatch.setattr(choose, "EXPLORE", 0.0)

    pool = Pool(rng=random.Random(5), upstreams={})
    nat = [Upstream(f"45.0.0.{n}", 8080, "http", https="yes", exit_ip="45.9.9.9") for n in (1, 2)]
    others = [
        Upstream(f"45.0.1.{n}", 8080, "http", https="yes", exit_ip=f"45.0.1.{n}")
        for n in range(1, 9)
    ]
    pool.replace([*nat, *others])
    for up in nat:
        pool.got_through(pool.upstreams[up.key], "shop.example")

    def picks() -> set[tuple[str, int]]:
        return {
            p.key
            for i in range(200)
            if (p := pool.pick(Want("a"), tunnel=False, now=60.0 + i, site="shop.example"))
        }

    assert picks() - {up.key for up in nat}, "one exit's proxies were preferred"
    pool.got_through(pool.upstreams[others[0].key], "shop.example")
    known = {up.key for up in nat} | {others[0].key}
    chosen = [
        p.key
        for i in range(200)
        if (p := pool.pick(Want("a"), tunnel=False, now=60.0 + i, site="shop.example"))
    ]
    assert len(chosen) == 200 and set(chosen) <= known, set(chosen) - known


def test_a_class_told_as_a_sites_block_is_the_block_on_its_other_urls() -> None:
    """A captcha page is the same whatever was asked: once a URL of a site told it from
    the real page, the same class on another URL of the site looks blocked there, the
    first time that URL is asked; a real page there does not, nor the class on another
    site."""
    from endpoint.router.pages import Pages

    pages = Pages()
    one, two = b"shop.example:80 /page/1", b"shop.example:80 /page/2"
    pages.add(one, ("45.0.0.2", 8080), WAIT)
    assert pages.told("shop.example", one, REAL) == {("45.0.0.2", 8080)}
    assert pages.splits("shop.example")
    assert pages.looks_blocked("shop.example", WAIT)
    assert not pages.looks_blocked("shop.example", REAL)
    assert not pages.looks_blocked("other.example", WAIT)
    assert pages.others(two, ("45.0.0.3", 8080)) == []  # nothing of the URL itself


def test_a_redirects_head_is_read_by_its_urls_answers_and_the_sites_blocks() -> None:
    """A redirect has no page to be held back by: its head is read at once, against
    what its URL got through other proxies (beside the page, a redirect away is the
    block, tried elsewhere before the client follows it) and where the site's blocks
    redirected (on another URL of it, whatever the redirect's size); with nothing to
    compare it with, or elsewhere, ``none``."""
    from endpoint.router.choose import Pool
    from endpoint.router.verdicts import head_verdict_of

    pool, site = Pool(), "shop.example"
    one, two = b"shop.example:80 /page/1", b"shop.example:80 /page/2"
    listed, other, third = ("45.0.0.2", 8080), ("45.0.0.3", 8080), ("45.0.0.4", 8080)

    def head(status: int, location: str, url: bytes, proxy: tuple[str, int]) -> str:
        return head_verdict_of(pool, site, None, status, location, url, proxy)

    assert head(302, AWAY.location, one, listed) == NONE  # nothing to compare with
    pool.pages.add(one, other, REAL)
    assert head(302, AWAY.location, one, listed) == BLOCKED
    assert head(302, AWAY.location, one, other) == NONE  # its own page is no other's
    assert head(302, AWAY.location, two, listed) == NONE  # not told as the block yet
    pool.pages.add(one, listed, AWAY)
    assert pool.pages.told(site, one, REAL) == {listed}
    assert head(302, "https://shop.example/welcome-gate?r=2", two, third) == BLOCKED
    assert head(301, "https://shop.example/page/2", two, third) == NONE
    assert head_verdict_of(pool, "", None, 302, AWAY.location, two, third) == NONE


def test_at_a_sites_first_split_a_proxy_whose_answers_alike_were_its_block_loses_standing() -> None:
    """Before a site tells a page from its block, two captcha pages alike on one URL read
    as the page and give their proxies standing. At its first split, on another URL,
    a proxy whose latest answer to any URL was of the class just told as the block is
    told too: it loses its standing at once (a tunnel cannot read its page, and picked
    by that standing it carried HTTPS requests into the captcha until a plain-HTTP
    request happened to read it: three misses of ``test_sites_box`` in one run). A
    proxy whose answers alike were the real page keeps its standing."""
    import random

    from endpoint.link.uplink import UpLink
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.verdicts import ALIKE, read_answer

    site = "shop.example"
    pool = Pool(rng=random.Random(1), upstreams={})
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 8)])
    a, b, c, d, e, f, g = pool.upstreams.values()
    real = REAL.head + b"<p>the rest of the catalogue</p>" * 10
    page, captcha = (real, len(real)), (WAIT.head, WAIT.size)

    def answered(
        up: Upstream, url: bytes, got: tuple[bytes, int]
    ) -> tuple[str, set[tuple[str, int]]]:
        link = UpLink(up, True, (), 1.0)
        link.status, link.seen, link.size = 200, bytearray(got[0]), got[1]
        said, told = read_answer(pool, site, None, link, url)
        if said == ALIKE:  # as router/forwarding.py learns it
            pool.got_through(up, site, alike_at=1.0)
        if told:
            pool.standing.lose(site, told)
        return said, told

    one, two, three = (f"{site}:80 /page/{n}".encode() for n in (1, 2, 3))
    assert answered(a, one, captcha) == (NONE, set())  # nothing to compare with
    assert answered(b, one, captcha) == (ALIKE, set())  # alike: the block alike, maybe
    assert answered(c, two, page) == (NONE, set())
    assert answered(d, two, page) == (ALIKE, set())
    assert set(pool.standing.through[site]) == {b.key, d.key}
    assert answered(e, three, captcha) == (NONE, set())
    said, told = answered(f, three, page)  # the site's first split
    assert said == THROUGH
    assert told == {e.key, a.key, b.key}, told
    assert set(pool.standing.through[site]) == {d.key}
    pool.got_through(f, site)
    # Told on the URL where its class is the block, and nowhere else.
    assert answered(g, two, page)[1] == set()
    assert set(pool.standing.through[site]) == {d.key, f.key}


def test_a_page_beside_a_block_page_on_its_url_gets_its_proxy_standing() -> None:
    """A site that answers its listed exits a short "Access denied" page (a 403 whose
    page is read: events/blockpages.py's sign) and the others its page: the page beside
    that block on the same URL is ``through``, as beside a 403 told by its head, and its
    proxy is known to get through at once. Before, the block page was no class, the page
    beside it said ``none``, and a site asked at each URL once taught the endpoint
    nothing of its own traffic: its HTTPS requests went through proxies picked blind
    until the fleet's word came (in logged runs of ``test_sites_box``, up to 29 s on its
    paced site). A page alone on its URL still says nothing."""
    import random

    from endpoint.link.uplink import UpLink
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.verdicts import read_answer

    site = "shop.example"
    pool = Pool(rng=random.Random(1), upstreams={})
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 5)])
    listed, other, let_in, alone = pool.upstreams.values()
    denied = b"<html><title>Access denied</title>45.0.0.1 is not allowed here.</html>"

    def answered(up: Upstream, url: bytes, status: int, page: bytes) -> str:
        link = UpLink(up, True, (), 1.0)
        link.status, link.seen, link.size = status, bytearray(page), len(page)
        said, told = read_answer(pool, site, None, link, url)
        assert not told, told
        if said == THROUGH:  # as router/forwarding.py learns it
            pool.got_through(up, site)
        return said

    one, two = (f"{site}:80 /page/{n}".encode() for n in (1, 2))
    assert answered(listed, one, 403, denied) == BLOCKED
    assert answered(other, one, 403, denied) == BLOCKED
    assert answered(let_in, one, 200, REAL.head) == THROUGH
    assert set(pool.standing.through[site]) == {let_in.key}
    assert answered(alone, two, 200, REAL.head) == NONE  # nothing to compare with


def test_redirects_alike_give_no_standing_before_a_sites_first_split() -> None:
    """A site that sends the exits it turns away to an interstitial (``/welcome``, no
    block word) gives them all the same redirect: before its first split, two such
    redirects alike on one URL read ``none`` and give their proxies no standing, where
    two pages alike read ``alike``. Read as the site's page, those redirects made two
    turned-away proxies the site's known ones, and HTTPS requests (tunnels, unread)
    went to its interstitial through them until a real page told them apart (logged
    runs of ``test_sites_box``: five and six such picks in a run, and a CI failure of
    two HTTPS misses on that site)."""
    import random

    from endpoint.link.uplink import UpLink
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.verdicts import ALIKE, read_answer

    site = "shop.example"
    pool = Pool(rng=random.Random(1), upstreams={})
    pool.replace([Upstream(f"45.0.0.{n}", 8080, "http") for n in range(1, 5)])
    a, b, c, d = pool.upstreams.values()

    def answered(up: Upstream, url: bytes, status: int, location: str, page: bytes) -> str:
        link = UpLink(up, True, (), 1.0)
        link.status, link.location = status, location
        link.seen, link.size = bytearray(page), len(page)
        said, told = read_answer(pool, site, None, link, url)
        assert not told, told
        if said == ALIKE:  # as router/forwarding.py learns it
            pool.got_through(up, site, alike_at=1.0)
        return said

    one, two = (f"{site}:80 /page/{n}".encode() for n in (1, 2))
    away = "/welcome?next=/page/1"
    assert answered(a, one, 302, away, b"") == NONE  # nothing to compare with
    assert answered(b, one, 302, away, b"") == NONE  # alike, but no page: nothing
    assert site not in pool.standing.through
    assert answered(c, two, 200, "", REAL.head) == NONE
    assert answered(d, two, 200, "", REAL.head) == ALIKE  # pages alike: the page, held
    assert set(pool.standing.through[site]) == {d.key}
