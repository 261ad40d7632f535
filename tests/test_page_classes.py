"""A site without a rule read by the classes of answers its request got through the
proxies (events/sites.py ``by_classes``, endpoint/router/pages.py): a block that looks
like a page is told from the page by what the other proxies got, never by how many got
which, and a split it cannot read says nothing."""

from __future__ import annotations

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
    assert generic(AWAY, []) == THROUGH  # alone, a site's redirect is its own


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


def test_what_the_endpoint_knows_without_pages_and_refusals_change_nothing() -> None:
    """The endpoint's word that some proxy got through (a 200 with no page read) and
    another proxy's refusal are not classes to compare with: a page is ``through`` as
    before, and a 403 beside a page is still the block."""
    assert generic(REAL, [Answer(status=200)]) == THROUGH
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


def test_the_endpoint_keeps_a_class_small_and_a_vendors_page_as_none() -> None:
    """A URL's classes keep what comparing reads, not the page (a few hundred bytes for
    a 9 KB page); a proxy's latest answer decides its class, and a vendor's block page,
    a block by itself, takes it out of every class."""
    from endpoint.router.pages import Pages

    pages, url = Pages(), b"shop.example:80 http://shop.example/"
    pages.add(url, ("45.0.0.1", 8080), REAL)
    pages.add(url, ("45.0.0.2", 8080), WAIT)
    (kept_real, kept_wait) = pages.classes(url)
    assert len(kept_real.head) < 100 and same_class(kept_real, REAL) and same_class(kept_wait, WAIT)
    assert by_classes(REAL, pages.others(url, ("45.0.0.1", 8080))) == THROUGH
    assert pages.got(url, WAIT) == {("45.0.0.2", 8080)}
    challenge = Answer(status=200, head=b"<script>window._cf_chl_opt={}</script>", size=9_000)
    pages.add(url, ("45.0.0.2", 8080), challenge)
    assert pages.got(url, WAIT) == set() and pages.classes(url) == [kept_real]
