"""What the rotating endpoint learns of sites from its consumers' traffic: an answer's
head read as it comes (a site that turned a request away is tried through another
proxy before anything reaches the client), a whole answer read for the picks that
follow (events/sites.py's rules; a site without one by the other proxies' answers).
What is learned acts at once (router/forwarding.py, through ``Charges.turned_away``); a
block is never the proxy's failure."""

from __future__ import annotations

import functools
from importlib.metadata import version

from publicsuffixlist import PublicSuffixList

from endpoint.link.uplink import UpLink
from endpoint.router.choose import Pool
from events.blockpages import SHORT_PAGE, SIGN_BYTES
from events.pages import readable
from events.sites import (
    BLOCKED,
    HEAD_BYTES,
    NONE,
    PACED,
    THROUGH,
    Answer,
    SiteRule,
    generic,
    head_verdict,
    refusal,
    rule_for,
    settled,
    site_key_ok,
    verdict,
)
from events.sites import site_of as _site_of

__all__ = [
    "ALIKE",
    "BLOCKED",
    "NONE",
    "PACED",
    "PSL_VERSION",
    "head_verdict_of",
    "keep_block",
    "page_bytes",
    "read_answer",
    "retry_after_s",
    "rule_of",
    "site_of",
]

# The public suffix list's ICANN section (a site is a registrable domain), made once; its
# version goes with every round of verdicts the endpoint publishes.
_PSL = PublicSuffixList(only_icann=True)
PSL_VERSION = version("publicsuffixlist")
# This endpoint's own reading, never published: the site's page, as far as answers alike
# to its URL say, on a site not seen telling a page from its block (read_answer).
ALIKE = "alike"


@functools.lru_cache(maxsize=8_192)
def site_of(host: str) -> str:
    """The site of a request to ``host``: its key, or "" when the host cannot make one
    (such a request is routed as any other and teaches nothing). Asked at every request,
    of the same few hosts again and again: each is read once."""
    try:
        ascii_host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        return ""
    site = _site_of(ascii_host, _PSL.privatesuffix)
    return site if site_key_ok(site) else ""


def rule_of(pool: Pool, site: str) -> SiteRule | None:
    """How ``site``'s answers read: the operator's rule, a built-in one, or None (the
    generic reading); asked once a request."""
    return rule_for(site, pool.rules) if site else None


def page_bytes(rule: SiteRule | None) -> int:
    """How much of an HTML answer a verdict by ``rule`` reads: its first ``HEAD_BYTES``
    when its rule has words or a least size, else what a block page is told by in
    (events/blockpages.py)."""
    return HEAD_BYTES if rule is not None and (rule.markers or rule.min_bytes) else SIGN_BYTES


def head_verdict_of(
    pool: Pool,
    site: str,
    rule: SiteRule | None,
    status: int,
    location: str,
    url: bytes = b"",
    proxy: tuple[str, int] = ("", 0),
) -> str:
    """What an answer's head says of ``site``: by its ``rule`` (events/sites.py); for a
    site without one, a redirect to a block page is a block, and so is a 403 (the status
    a site turns a client away with, not a page that is missing) or a proxy's 502-504 (it
    could not get the page) where another proxy got the site's pages; a 429 paces. A
    redirect has no page to be held back by: it is read at once as its whole answer
    will be (``read_answer``), against the answers ``url`` got through proxies other than
    ``proxy`` and the site's blocks, so a redirect to an interstitial is tried elsewhere
    before the client follows it. A request that names no site: ``none``."""
    if not site:
        return NONE
    if rule is not None:
        return head_verdict(rule, status, location)
    if 200 <= status < 300:
        return NONE  # a page's verdict is its page's, read when it has come (read_answer)
    answer, others = Answer(status=status, location=location), _others(pool, site)
    redirect = url and 300 <= status < 400 and location and not pool.pages.sent_to(site, url)
    if redirect:
        others += pool.pages.others(url, proxy)
    said = generic(answer, others)
    if redirect and said != BLOCKED and pool.pages.redirects_to_block(site, answer):
        said = BLOCKED
    return said if said in (BLOCKED, PACED) else NONE


def keep_block(
    pool: Pool, site: str, url: bytes, proxy: tuple[str, int], answer: Answer
) -> set[tuple[str, int]]:
    """A block through ``proxy`` (told by its head, ``head_verdict_of``, or by its
    page, ``read_answer``), kept as a class of ``url``: the pages beside it read as the
    site's own. A page or redirect told as the block beside a page there splits the site
    (``Pages.told_blocked``): the proxies that tells, their standing there taken (the
    caller turns them away)."""
    told = pool.pages.told_blocked(site, url, answer) - {proxy}
    pool.pages.add(url, proxy, answer)
    if told:
        pool.standing.lose(site, told)
    return told


def retry_after_s(value: bytes) -> float | None:
    """A Retry-After's seconds (None: absent, or a date, which the endpoint does not
    read: the default pace holds then)."""
    return float(value) if value.strip().isdigit() else None


def _others(pool: Pool, site: str) -> list[Answer]:
    """What other proxies got from ``site``, as far as a verdict asks: its page, when
    one is known to get through."""
    return [_PAGE] if pool.standing.through.get(site) else []


_PAGE = Answer(status=200)


def read_answer(
    pool: Pool, site: str, rule: SiteRule | None, link: UpLink, url: bytes
) -> tuple[str, set[tuple[str, int]]]:
    """What a whole answer of ``site`` through ``link`` to ``url`` says, read by
    ``rule``: its page got through, the site turned it away (its words, or a stub), or
    paced it; and the proxies a page told as the block (their class's, whose standing
    there is taken at once: the caller charges them to the consumer), or, at a site's
    first split, those whose answers elsewhere were of a block's class. A site without a
    rule is read against the other classes of answers ``url`` got through other proxies
    (router/pages.py); where the site told a page from its block lately, answers alike
    are ``none``."""
    if rule is not None and (link.head_only or link.status in (204, 304)):
        return head_verdict(rule, link.status, link.location), set()  # no page to read
    if link.seen or link.signs:
        answer = Answer(
            status=link.status,
            location=link.location,
            head=readable(bytes(link.seen), link.encoding.decode("latin-1")),
            # Read while still coming: longer than what came, so not a short page.
            size=link.size if link.whole else max(link.size, SHORT_PAGE + 1),
            headers=tuple(link.signs),
        )
    else:  # no page read (not HTML), nor a header that tells a block page
        answer = Answer(status=link.status, location=link.location, size=link.size)
    if rule is not None:
        return verdict(rule, answer), set()
    pages = pool.pages
    if pages.sent_to(site, url):
        # A page the site sent a proxy's visitor to (an interstitial the client followed):
        # the same for every exit, so it tells none from another, and teaches nothing.
        said = generic(answer, [])
        return (NONE if said == THROUGH else said), set()
    said = generic(answer, _others(pool, site) + pages.others(url, link.up.key))
    if 300 <= answer.status < 400 and answer.location:
        pages.sends_to(site, answer.location)
    if refusal(answer) or (
        200 <= answer.status < 400 and (answer.head or answer.size or answer.location)
    ):
        if said == BLOCKED:
            return said, keep_block(pool, site, url, link.up.key, answer)
        if pages.looks_blocked(site, answer):
            said, told = BLOCKED, set()  # the class told as this site's block elsewhere
        else:
            told = pages.told(site, url, answer) if said == THROUGH else set()
        pages.add(url, link.up.key, answer)
        if told:
            pool.standing.lose(site, told)
        if said == THROUGH and settled(said, bool(told), True, pages.classes(url)) == NONE:
            # Answers alike, no block told beside them: where the site told a page from
            # its block lately, nothing; redirects alike, nothing either (a site sends
            # every exit it turns away to the same interstitial, and standing read from
            # them took HTTPS requests there); else the page for the picks, held from
            # the log until the site has gone a while without a split (router/tally.py).
            said = NONE if pages.splits(site) or answer.status >= 300 else ALIKE
        return said, told
    return said, set()
