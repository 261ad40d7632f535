"""Block pages and real pages recorded from real sites by public projects
(tests/fixtures/recorded, each file's origin and licence in its NOTICE.md): the block
pages read as blocked whatever the site, by a site's rule or without one; the real pages
never do, by google.com's built-in rule either; compressed, each reads as its plain form.

The vendors and sites no licensed recording was found of are written from their makers'
public descriptions in tests/test_blockpages.py."""

from __future__ import annotations

import gzip
from pathlib import Path

import brotli
import pytest

from events.blockpages import SIGN_BYTES, block_sign
from events.pages import readable
from events.sites import BLOCKED, NONE, THROUGH, Answer, SiteRule, generic, rule_for, verdict

RECORDED = Path(__file__).parent / "fixtures" / "recorded"
# (file, its maker): the block pages.
BLOCKS = [
    ("cloudflare-1006-access-denied.html", "cloudflare"),
    ("cloudflare-captcha-2016.html", "cloudflare"),
    ("cloudflare-captcha-2019.html", "cloudflare"),
    ("cloudflare-js-challenge-2019.html", "cloudflare"),
    ("cloudflare-js-challenge-2020.html", "cloudflare"),
    ("sucuri-challenge-2019.html", "sucuri"),
]
REAL = ["real-google-de-and-hltv-with-recaptcha.html", "real-cloudflare-email-protection.html"]
SITES = ("example.com", "google.com", "amazon.com", "reddit.com")


def _answer(page: bytes, status: int = 200) -> Answer:
    # What an edge keeps of an answer: its first bytes after its Content-Encoding.
    return Answer(status=status, head=page[: 4 * SIGN_BYTES], size=len(page))


@pytest.mark.parametrize(("name", "maker"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_recorded_block_page_reads_as_blocked_whatever_the_site(name: str, maker: str) -> None:
    """Each recorded block page is told by its maker's signs, not only by its title
    (a challenge is served 200, 403 or 503), and read as turned away by a site without
    a rule, by a rule that has no word of it, and by the six sites' built-in rules."""
    page = (RECORDED / name).read_bytes()
    assert block_sign(page, len(page)) == maker
    for status in (200, 403, 503):
        answer = _answer(page, status)
        assert generic(answer, []) == BLOCKED
        assert verdict(SiteRule(site="example.com"), answer) == BLOCKED
        for site in SITES:
            rule = rule_for(site, ())
            assert verdict(rule or SiteRule(site=site), answer) == BLOCKED, site


@pytest.mark.parametrize("name", REAL)
def test_a_recorded_real_page_is_not_a_block(name: str) -> None:
    """Real pages with a vendor's script on them (reCAPTCHA's, Cloudflare's e-mail
    protection) are no block: not by a sign, not for a site without a rule, and not by
    google.com's built-in rule, whose "/recaptcha/" marker read google.de's own home
    page as its block page."""
    page = (RECORDED / name).read_bytes()
    assert block_sign(page, len(page)) == ""
    answer = _answer(page)
    assert generic(answer, []) == NONE  # alone, nothing to compare with
    assert generic(answer, [answer]) == THROUGH
    for site in SITES:
        rule = rule_for(site, ())
        if rule is not None and rule.min_bytes <= len(page):
            assert verdict(rule, answer) == THROUGH, site


def test_a_recorded_page_compressed_reads_as_its_plain_form() -> None:
    """A recorded block page sent gzip or br is read after its Content-Encoding: the
    same sign, the same verdict."""
    page = (RECORDED / "cloudflare-js-challenge-2020.html").read_bytes()
    for coding, packed in (("gzip", gzip.compress(page)), ("br", brotli.compress(page))):
        plain = readable(packed, coding)
        assert page.startswith(plain)
        assert block_sign(plain, len(page)) == "cloudflare"
        assert generic(Answer(status=503, head=plain, size=len(page)), []) == BLOCKED
