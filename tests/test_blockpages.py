"""Block pages told by their makers' signs (events/blockpages.py), whatever the site, and
pages read after their Content-Encoding (events/pages.py).

No licensed recording of these vendors' pages was found to copy, so each page below is
written from its maker's public description (named beside it) and marked so: the few
lines a page has that its maker documents, inside a page of the usual size. The pages
that must not read as blocks are a protected site's own pages, with the vendor's scripts
that every page of such a site carries."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest

from events.blockpages import block_sign
from events.pages import readable
from events.sites import BLOCKED, NONE, THROUGH, Answer, SiteRule, generic, verdict

FILLER = "<p>" + "An ordinary paragraph of the site's own text. " * 40 + "</p>"


def _page(title: str, body: str, filler: int = 0) -> bytes:
    return (
        f"<!DOCTYPE html><html><head><title>{title}</title></head><body>{body}"
        f"{FILLER * filler}</body></html>"
    ).encode()


# (maker, page, headers): written from the makers' public descriptions, not recorded.
BLOCKS = [
    # developers.cloudflare.com, "Detect a Challenge Page response": cf-mitigated.
    ("cloudflare", _page("Just a moment...", "<div id=challenge-stage></div>"),
     (("cf-mitigated", "challenge"),)),
    # Cloudflare's managed challenge page: its options object and orchestration script.
    ("cloudflare", _page("www.example.com", "<script>window._cf_chl_opt={cType:'managed'};"
     "</script><script src='/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page/v1'>"),
     ()),
    # Cloudflare's block page, "Sorry, you have been blocked ... Cloudflare Ray ID".
    ("cloudflare", _page("Attention Required! | Cloudflare", "<h1>Sorry, you have been "
     "blocked</h1><span>Cloudflare Ray ID: 8a1b2c3d4e5f6789</span>"), ()),
    # Akamai's edge error page (errors.edgesuite.net).
    ("akamai", _page("Access Denied", "<H1>Access Denied</H1>You don't have permission to "
     "access this server.<P>Reference&#32;&#35;18&#46;2f1b1002&#46;1701700000"
     "<P>https&#58;&#47;&#47;errors&#46;edgesuite&#46;net"), ()),
    # DataDome's captcha page, served from geo.captcha-delivery.com.
    ("datadome", _page("example.com", "<script src='https://ct.captcha-delivery.com/c.js'>"
     "</script><iframe src='https://geo.captcha-delivery.com/captcha/?initialCid=x'>"), ()),
    # HUMAN (PerimeterX) block page: "Press & Hold" in its px-captcha element.
    ("perimeterx", _page("Access to this page has been denied", "<div id=\"px-captcha\">"
     "</div><p>Press &amp; Hold to confirm you are a human (and not a bot).</p>"), ()),
    # Imperva (Incapsula): "Request unsuccessful. Incapsula incident ID".
    ("imperva", _page("", "<iframe src='/_Incapsula_Resource?CWUDNSAI=2'>Request "
     "unsuccessful. Incapsula incident ID: 1234000010000000-123456789</iframe>"), ()),
    # docs.aws.amazon.com, AWS WAF "CAPTCHA and Challenge actions": x-amzn-waf-action.
    ("aws-waf", _page("Human Verification", "<div id=captcha-container></div>"),
     (("x-amzn-waf-action", "captcha"),)),
    ("aws-waf", _page("", "<script src='https://x.token.awswaf.com/challenge.js'></script>"),
     (("X-Amzn-Waf-Action", "challenge"),)),
    # A site's own interstitial with a captcha widget, calling itself what it is.
    ("page", _page("Are you a robot?", "<div class='g-recaptcha' data-sitekey='x'></div>"), ()),
    ("page", _page("Security check", "<div class='h-captcha' data-sitekey='x'></div>"), ()),
]  # fmt: skip

# A protected site's own pages: every vendor's script that rides on real pages.
REAL = [
    _page("Example Store - shoes", "<script src='/cdn-cgi/challenge-platform/scripts/jsd/"
          "main.js'></script><h1>Shoes</h1>", filler=4),
    _page("News | Example", "<script src='https://js.datadome.co/tags.js'></script>", 4),
    _page("Checkout", "<script>window._pxAppId='PXabc123';</script><form>...</form>", 4),
    _page("Home", "<script src='/_Incapsula_Resource?SWJIYLWA=719d34d31c8e3a6e6fffd425f7e032f3'>"
          "</script>", 4),
    # A login form with a captcha widget: a page of its own, not a block.
    _page("Sign in - Example", "<form><div class='g-recaptcha'></div></form>", 40),
    # Words of a block in a long article's title are not a block page.
    _page("Why captcha pages annoy everyone", "<article>...</article>", 40),
]  # fmt: skip


@pytest.mark.parametrize(("maker", "page", "headers"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_each_makers_block_page_reads_as_blocked_whatever_the_site(
    maker: str, page: bytes, headers: tuple[tuple[str, str], ...]
) -> None:
    """A vendor's challenge or block page is told by its signs, and read as turned away
    by a site without a rule (a 200 captcha page read as ``through`` made learning
    worse than blind) and by a rule that has no word of it."""
    assert block_sign(page, len(page), headers) == maker
    answer = Answer(status=200, head=page, size=len(page), headers=headers)
    assert generic(answer, []) == BLOCKED
    assert verdict(SiteRule(site="example.com"), answer) == BLOCKED


@pytest.mark.parametrize("page", REAL, ids=range(len(REAL)))
def test_a_protected_sites_own_page_is_not_a_block(page: bytes) -> None:
    """The scripts a vendor puts on every page of a site it protects, a captcha widget
    on a long page, block words in a long page's title: none is a block."""
    assert block_sign(page, len(page)) == ""
    answer = Answer(status=200, head=page, size=len(page))
    assert generic(answer, []) == NONE  # alone, nothing to compare with
    assert generic(answer, [answer]) == THROUGH


def test_a_gzip_a_deflate_and_a_br_page_read_as_their_plain_form() -> None:
    """A compressed page is read after its Content-Encoding, however it was cut: a
    vendor's block page sent gzip, deflate or br is still told; a page that does not
    decode is read as it came; a bomb yields at most the bytes a verdict reads."""
    maker, page, _ = BLOCKS[3]
    for coding, packed in (
        ("gzip", gzip.compress(page)),
        ("deflate", zlib.compress(page)),
        ("br", brotli.compress(page)),
    ):
        assert readable(packed, coding) == page
        assert block_sign(readable(packed, coding), len(page)) == maker
        assert page.startswith(readable(packed[: len(packed) * 2 // 3], coding))
    assert readable(b"not gzip at all", "gzip") == b"not gzip at all"
    assert readable(page, "") == page
    bomb = gzip.compress(b"\0" * (50 << 20))
    assert len(readable(bomb, "gzip")) <= 64 * 1024
