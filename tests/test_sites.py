"""Sites and verdicts at the edge (events/sites.py): a site's key, and whether an answer
through a proxy got the site's page, by each built-in rule, an operator's and the
generic comparison."""

from __future__ import annotations

import pytest
from publicsuffixlist import PublicSuffixList

from events.sites import (
    BLOCKED,
    BUILTIN_RULES,
    NONE,
    PACED,
    THROUGH,
    Answer,
    SiteRule,
    generic,
    head_verdict,
    read,
    rule_for,
    site_key_ok,
    site_of,
    verdict,
)

PSL = PublicSuffixList(only_icann=True)


def test_a_site_is_the_registrable_domain_the_host_or_the_address() -> None:
    """Hosts of one registrable domain are one site (by the ICANN section: a private
    suffix such as github.io is not one); a name the list has no suffix for is its own
    site; an address in any notation is the address, canonical."""
    name = PSL.privatesuffix
    assert site_of("www.google.co.uk", name) == site_of("GOOGLE.co.uk.", name) == "google.co.uk"
    assert site_of("a.b.shop.example", name) == "shop.example"
    assert site_of("alice.github.io", name) == "github.io"
    assert site_of("localhost", name) == "localhost"
    assert site_of("[2001:DB8::1]", name) == "2001:db8::1"
    assert site_of("203.0.113.7", name) == "203.0.113.7"
    assert all(site_key_ok(site_of(h, name)) for h in ("www.reddit.com", "[::1]", "intranet"))


@pytest.mark.parametrize(
    "key, ok",
    [
        ("google.com", True),
        ("xn--bcher-kva.example", True),
        ("203.0.113.7", True),
        ("2001:db8::1", True),
        ("Google.com", False),  # keys are lower-case: one site, one key
        ("a..b", False),
        ("1.2.3", False),  # digits and dots: an address or nothing
        ("2001:DB8::1", False),  # an address in its canonical text only
        ("a" * 64 + ".com", False),  # a label of 64
        ("", False),
        ("ppf.>", False),
    ],
)
def test_the_fold_checks_a_site_keys_form(key: str, ok: bool) -> None:
    """A site key is a lower-case DNS name or a canonical address; anything else is
    refused, whatever list named it."""
    assert site_key_ok(key) is ok


def _page(text: str, status: int = 200, pad: int = 10_000, location: str = "") -> Answer:
    body = (text + " " * pad).encode()
    return Answer(status=status, location=location, head=body[:65_536], size=len(body))


# Answers as each site turns a client away (its own words, status and redirect) and as
# it serves its page, one pair per way.
TURNED_AWAY = [
    ("google.com", _page("", 302, location="https://www.google.com/sorry/index?continue=x")),
    ("reddit.com", _page("You've been blocked by network security.", 403)),
    ("amazon.com", _page('<form action="/errors/validateCaptcha">', 200)),
    ("amazon.com", _page("To discuss automated access to Amazon data please contact", 503)),
    ("amazon.com", _page("<html></html>", 200, pad=0)),  # a stub, not the store
    ("instagram.com", _page("", 302, location="https://www.instagram.com/accounts/login/")),
    ("tiktok.com", _page('<div id="captcha-verify-container">', 200)),
    ("tiktok.com", _page("<html>ok</html>", 200, pad=100)),
    ("discord.com", _page('<div id="cf-error-details">Sorry, you have been blocked', 403)),
]
# Their rate limits (429): the site paces that exit, it did not turn it away.
RATE_LIMITED = [
    ("google.com", _page("<title>Sorry...</title>Our systems have detected unusual traffic", 429)),
    ("reddit.com", _page("<h1>whoa there, pardner!</h1>", 429)),
    ("instagram.com", _page("Please wait a few minutes before you try again.", 429)),
    ("discord.com", _page("error code: 1015 You are being rate limited", 429)),
    ("shop.example", _page("slow down", 429)),
]
THROUGH_PAGES = [
    ("google.com", _page("<title>Google</title><form action=/search>")),
    ("reddit.com", _page("<title>reddit: the front page of the internet</title>")),
    ("amazon.com", _page("<title>Amazon.com. Spend less. Smile more.</title>")),
    ("instagram.com", _page("<title>Instagram</title>")),
    ("tiktok.com", _page("<title>TikTok - Make Your Day</title>")),
    ("discord.com", _page("<title>Discord | Your Place to Talk and Hang Out</title>")),
]


def _ids(value: object) -> str:
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize("site, answer", TURNED_AWAY, ids=_ids)
def test_each_built_in_site_reads_its_block_pages_as_turned_away(site: str, answer: Answer) -> None:
    """A redirect to a captcha or login path, a block status, a block page's words (even
    under a 200) and a stub shorter than the site's page are each turned away."""
    rule = rule_for(site, ())
    assert rule is not None
    assert verdict(rule, answer) == BLOCKED


@pytest.mark.parametrize("site, answer", RATE_LIMITED, ids=_ids)
def test_a_rate_limit_paces_on_every_site_and_never_blocks(site: str, answer: Answer) -> None:
    """A 429, block words in it or not, with a rule (the built-ins list 429 among their
    block statuses, an operator's rule may) or without: ``paced``, never ``blocked`` (a
    site that rate-limits an exit lets it through, slower)."""
    rule = rule_for(site, ())
    if rule is not None:
        assert verdict(rule, answer) == PACED
        assert head_verdict(rule, answer.status, answer.location) == PACED
    assert generic(answer, [Answer(status=200)]) == PACED
    assert read(rule, answer, [Answer(status=200)]) == PACED


@pytest.mark.parametrize(
    "site, answer", THROUGH_PAGES, ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_built_in_site_reads_its_page_as_through(site: str, answer: Answer) -> None:
    """The site's own page is through; no answer at all is no verdict (a dead or slow
    proxy is not a block)."""
    rule = rule_for(site, ())
    assert rule is not None
    assert verdict(rule, answer) == THROUGH
    assert verdict(rule, Answer()) == NONE


def test_the_six_built_in_sites_are_the_public_checkers_six() -> None:
    """Google, Reddit, Amazon, Instagram, TikTok and Discord, one rule each."""
    assert sorted(r.site for r in BUILTIN_RULES) == [
        "amazon.com", "discord.com", "google.com", "instagram.com", "reddit.com", "tiktok.com",
    ]  # fmt: skip


def test_an_operators_rule_takes_over_and_reads_its_own_markers() -> None:
    """``ppf sites add``'s rule for a site wins over the built-in one; its statuses,
    markers, redirect paths and minimum size decide."""
    mine = SiteRule(site="google.com", through=(200, 204), blocked=(451,), markers=("paywall",))
    assert rule_for("google.com", [mine]) is mine
    assert verdict(mine, _page("", 204, pad=0)) == THROUGH
    assert verdict(mine, _page("", 451)) == BLOCKED
    assert verdict(mine, _page("a paywall here")) == BLOCKED
    assert verdict(mine, _page("", 429)) == PACED  # a rate limit, whatever a rule names
    shop = SiteRule(site="shop.example", redirects=("/captcha",), min_bytes=500)
    assert verdict(shop, _page("", 302, location="/captcha?x=1")) == BLOCKED
    assert verdict(shop, _page("", 302, location="/cart")) == NONE
    assert verdict(shop, _page("tiny", pad=0)) == BLOCKED


def test_a_site_without_rules_blocks_only_against_what_others_got() -> None:
    """On a site without rules a 403 is turned away only when other proxies got the page
    for the same request; alone, or where everyone gets a 403, it says nothing."""
    ok, no = Answer(status=200), Answer(status=403)
    assert generic(no, [ok, ok, ok]) == BLOCKED
    assert generic(ok, [ok, no]) == THROUGH
    assert generic(no, []) == NONE
    assert generic(no, [no, no]) == NONE
    assert generic(Answer(), [ok]) == NONE
    assert rule_for("unknown.example", ()) is None
    captcha = Answer(status=302, location="/captcha?return=/")
    assert generic(captcha, []) == BLOCKED  # a redirect to a block page, whatever others got


@pytest.mark.parametrize("rule", BUILTIN_RULES, ids=lambda r: r.site)
def test_each_built_in_sites_words_alone_tell_its_block_page_under_a_200(rule: SiteRule) -> None:
    """Each word of a built-in site's rule, in a page the site answers 200 (no block
    status, no redirect, long enough), reads ``blocked``; the same page without it
    reads ``through``. So emptying a site's words fails here (before, its block pages
    were tested by status and redirect, which a rule without words still reads). The
    pages are written for the test around the words each site is known to answer."""
    assert rule.markers
    for marker in rule.markers:
        filler = "<p>" + "the site's own page. " * 600 + "</p>"
        page = f"<html><title>{rule.site}</title>{filler}<div>{marker}</div></html>"
        plain = f"<html><title>{rule.site}</title>{filler}</html>"
        assert verdict(rule, _page(page, 200, pad=0)) == BLOCKED, (rule.site, marker)
        assert verdict(rule, _page(plain, 200, pad=0)) == THROUGH, rule.site
