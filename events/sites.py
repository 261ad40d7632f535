"""Sites and verdicts: which site a request goes to, and whether its answer got through.

A site is named at the edge (the agents' probes, the rotating endpoint's traffic): the
registrable domain of the host by the public suffix list's ICANN section, which the edge
passes in (``registrable``: its list, of the version it records beside what it
publishes), the host itself where the list knows no suffix (an operator's target on a
name of its own), or the address when there is no name. The fold checks a site key's
form only (``site_key_ok``), so no digest depends on the list's version.

A verdict says, of one answer through one proxy: ``through`` (the site's own page),
``blocked`` (turned away) or ``none`` (nothing to judge: a timeout, a reset before any
answer; a slow or dead proxy is not a block). A redirect to a block page (a path with
a word such as "captcha": ``BLOCK_PATH_WORDS``) is a block on any site. A ``SiteRule``
reads an answer's status, its redirect and the first ``HEAD_BYTES`` of its page: built
in for six large sites, set by the operator for its targets (``ppf sites add``). A site
without a rule is read by ``generic``: a status or a page counts as turned away only
when other proxies got a different answer to the same request. Pure.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Any, Generic, NamedTuple, TypeVar, overload
from urllib.parse import urlsplit

import msgspec

from events.blockpages import block_sign, title_of, unnamed

__all__ = [
    "BLOCKED",
    "BUILTIN_RULES",
    "COULD_NOT_GET",
    "HEAD_BYTES",
    "NONE",
    "PACED",
    "RATE_LIMITED",
    "THROUGH",
    "VERDICTS",
    "Answer",
    "Look",
    "SiteRule",
    "blocked_redirect",
    "blockish",
    "by_classes",
    "compared",
    "generic",
    "head_verdict",
    "page_title",
    "path_of",
    "read",
    "redirect_target",
    "refusal",
    "rule_for",
    "same_class",
    "settled",
    "site_key_ok",
    "site_of",
    "tells",
    "url_on_site",
    "verdict",
]

THROUGH, BLOCKED, NONE = "through", "blocked", "none"
VERDICTS = (THROUGH, BLOCKED, NONE)
# A rate limit (429): the site paces that exit, it does not turn it away. An edge slows
# that proxy for that site (for its Retry-After) and never says it as a block; read
# before any rule, the built-ins' and an operator's alike.
PACED = "paced"
RATE_LIMITED = 429
# What of a page is read: the blocks that matter say so early (a captcha's form, a
# block page's title), and a verdict must not cost a page's download.
HEAD_BYTES = 64 * 1024

# A site key: a lower-case DNS name of at most 253 characters (letters, digits, '-',
# dots between labels), or an IPv4 or IPv6 address in its canonical text.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"(?=.{{1,253}}$)(?:{_LABEL}\.)*{_LABEL}")


def site_key_ok(key: str) -> bool:
    """Whether ``key`` has a site key's form (the fold's only check of it)."""
    if _NAME.fullmatch(key) and not key.replace(".", "").isdigit():
        return True
    try:
        return str(ipaddress.ip_address(key)) == key
    except ValueError:
        return False


def site_of(host: str, registrable: Callable[[str], str | None]) -> str:
    """The site of a request to ``host``: the address when it is one, else the
    registrable domain ``registrable`` finds, else the host itself."""
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return registrable(host) or host


_T = TypeVar("_T")


class _Once(Generic[_T]):
    """A property of an answer read at its first use and kept in the answer's
    ``__dict__``, where every later use finds it as a plain attribute.
    ``functools.cached_property`` does the same, but on Python 3.11 it takes a lock at
    every first read: 3 % of a serving endpoint's samples (docs/decisions.md, The endpoint)."""

    def __init__(self, read: Callable[[Any], _T]) -> None:
        self.read, self.name = read, read.__name__
        self.__doc__ = read.__doc__

    @overload
    def __get__(self, answer: None, owner: type) -> _Once[_T]: ...
    @overload
    def __get__(self, answer: object, owner: type | None = None) -> _T: ...
    def __get__(self, answer: object, owner: type | None = None) -> _T | _Once[_T]:
        if answer is None:
            return self
        value = answer.__dict__[self.name] = self.read(answer)
        return value


class Look(NamedTuple):
    """What ``same_class`` compares of an answer."""

    kind: int  # the status's hundreds
    target: str  # where a redirect goes (``redirect_target``)
    title: bytes  # ``page_title``
    size: int


class Answer(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """What an edge saw of one answer through one proxy: its status (0: none came), its
    ``Location``, and the first ``HEAD_BYTES`` of its body, decoded (its length, whole);
    ``closed``: the way to the site was open and it ended before any answer.

    Its ``sign`` and ``look`` are read once, when first asked (kept in its ``__dict__``):
    one answer meets several rules and is compared with every class of its URL, and
    each read of its page was a pass over it (docs/decisions.md, The endpoint)."""

    status: int = 0
    location: str = ""
    head: bytes = b""
    size: int = 0
    closed: bool = False
    # The headers a block page is told by (events/blockpages.py), lower-case names.
    headers: tuple[tuple[str, str], ...] = ()

    @_Once
    def sign(self) -> str:
        """The maker of the block page it is, "" for none (events/blockpages.py)."""
        return block_sign(self.head, self.size, self.headers)

    @_Once
    def look(self) -> Look:
        """What ``same_class`` compares of it, its title parsed."""
        return Look(self.status // 100, redirect_target(self), page_title(self.head), self.size)


class SiteRule(msgspec.Struct, frozen=True, kw_only=True):
    """How a site's answers read. ``through``: statuses that are its page; ``blocked``:
    statuses that turn a client away; ``markers``: text (case-insensitive) that makes
    any page a block page (a captcha, "unusual traffic"); ``redirects``: paths a
    redirect to which turns a client away; ``min_bytes``: a page shorter than this is a
    stub the site answers bots with."""

    site: str
    through: tuple[int, ...] = (200,)
    blocked: tuple[int, ...] = (403, 429)
    markers: tuple[str, ...] = ()
    redirects: tuple[str, ...] = ()
    min_bytes: int = 0


# Words of the paths sites send a client they turn away to (a captcha, a challenge, a
# "sorry" page): a redirect to one is a block on any site, with a rule or without.
BLOCK_PATH_WORDS = ("captcha", "challenge", "blocked", "denied", "sorry", "verify")


def blocked_redirect(status: int, location: str, paths: Iterable[str] = ()) -> bool:
    """Whether an answer is a redirect to a block page: to one of ``paths`` (a rule's),
    or to a path with a word of ``BLOCK_PATH_WORDS``."""
    if not (300 <= status < 400 and location):
        return False
    path = (urlsplit(location).path or "/").lower()
    return any(path.startswith(p) for p in paths) or any(w in path for w in BLOCK_PATH_WORDS)


def verdict(rule: SiteRule, answer: Answer) -> str:
    """``through``, ``blocked`` or ``none`` for ``answer`` by ``rule`` (a connection
    closed before any answer is read as a site without a rule reads it: ``generic``)."""
    if answer.status == 0:
        return NONE
    if answer.status == RATE_LIMITED:
        return PACED
    if blocked_redirect(answer.status, answer.location, rule.redirects):
        return BLOCKED
    if answer.sign:
        return BLOCKED
    if answer.head:
        page = answer.head.lower()
        if any(m.lower().encode() in page for m in rule.markers):
            return BLOCKED
    if answer.status in rule.blocked:
        return BLOCKED
    if answer.status in rule.through:
        return BLOCKED if answer.size < rule.min_bytes else THROUGH
    return NONE


def head_verdict(rule: SiteRule, status: int, location: str) -> str:
    """What an answer's head alone says by ``rule``: ``blocked`` for a block status or a
    redirect to a block path, ``paced`` for a rate limit, else ``none`` (its page may
    still say otherwise)."""
    if status == RATE_LIMITED:
        return PACED
    if status in rule.blocked or blocked_redirect(status, location, rule.redirects):
        return BLOCKED
    return NONE


def generic(answer: Answer, others: Iterable[Answer]) -> str:
    """A site without a rule. ``blocked``: a redirect to a block page; a block page by
    its maker's signs, whatever its status (events/blockpages.py); or a refusal (a
    403, a proxy's 502-504 that could not get the page, a connection closed
    before any answer) where another proxy got the site's page (a 2xx) for the same
    request. ``through``: a 2xx or a 3xx of the site's own, read by its classes: a page
    or a redirect with nothing to compare with is ``none``, a page where other proxies
    were refused is ``through``. Else ``none``: a refusal
    alone (or where everyone is refused) says nothing, nor does a timeout. A rate limit
    is ``paced``."""
    if answer.status == RATE_LIMITED:
        return PACED
    if blocked_redirect(answer.status, answer.location):
        return BLOCKED
    if answer.sign:
        return BLOCKED  # a vendor's challenge, or a page that says it is a block
    if 200 <= answer.status < 400:
        others = list(others)
        read = [o for o in others if 200 <= o.status < 400 and (o.head or o.size or o.location)]
        if (
            not read
            and answer.status < 300
            and (not answer.head or any(refusal(o) for o in others))
        ):
            # No page to read (not HTML), or the page other proxies were refused: the
            # site's own, as its status says.
            return THROUGH
        return by_classes(answer, read)
    if refusal(answer) and any(200 <= o.status < 300 for o in others):
        return BLOCKED
    return NONE


# A proxy's own word that it could not get the page (bad gateway, unavailable, timeout).
COULD_NOT_GET = frozenset({502, 503, 504})
_REFUSALS = frozenset({403}) | COULD_NOT_GET


def refusal(answer: Answer) -> bool:
    """Whether an answer is a refusal: a connection closed before any answer, a 403, or
    a proxy's 502-504 (it could not get the page)."""
    return answer.closed or answer.status in _REFUSALS


def by_classes(answer: Answer, others: Iterable[Answer]) -> str:
    """A page or a redirect of a site without a rule, against the answers other proxies
    got to the same request (each read: a page, a redirect). With none to compare with,
    ``none``. Answers that look alike are one class (``same_class``); where the classes
    disagree, the one that looks like a
    block beside the others (``blockish``) is ``blocked`` and the others ``through``,
    never by how many exits got which: most exits may be turned away. Where no class
    can be told from the others, ``none``: never ``through`` on a split it cannot read."""
    others = list(others)
    if not others:
        return NONE  # nothing to compare with: the first answer may be the block
    differing = [o for o in others if not same_class(answer, o)]
    if not differing:
        return THROUGH
    mine = any(blockish(answer, o) for o in differing)
    theirs = [blockish(o, answer) for o in differing]
    if mine and not any(theirs):
        return BLOCKED
    if all(theirs) and not mine:
        return THROUGH
    return NONE


def tells(answer: Answer, others: Iterable[Answer]) -> bool:
    """Whether ``answer`` tells another class of ``others`` as the block beside it."""
    return any(not same_class(o, answer) and blockish(o, answer) for o in others)


def settled(said: str, told: bool, splits: bool, others: Iterable[Answer]) -> str:
    """A ``through`` read from answers alike (not ``told`` from a block), where the site
    told a page from its block lately (``splits``) and no proxy was refused beside it:
    ``none``. Most exits may be turned away, so answers alike there may be the block
    alike; only a page told from a block, or beside a refusal, is ``through``."""
    if said == THROUGH and not told and splits and not any(refusal(o) for o in others):
        return NONE
    return said


def compared(answer: Answer) -> Answer:
    """What comparing reads of an answer (``same_class``, ``blockish``): its status,
    redirect, title and size; a few hundred bytes, never its page."""
    title = page_title(answer.head)
    head = b"<title>" + title + b"</title>" if title else b""
    return Answer(
        status=answer.status, location=answer.location, head=head, size=answer.size,
        closed=answer.closed,
    )  # fmt: skip


def same_class(a: Answer, b: Answer) -> bool:
    """Whether two answers to one request look alike: the same kind of status, the same
    redirect target, the same title, and lengths within a factor of ``FAR`` (a page's
    size moves a little from answer to answer; a block page is far shorter)."""
    x, y = a.look, b.look
    return (
        x.kind == y.kind
        and x.target == y.target
        and x.title == y.title
        and not _far_apart(x.size, y.size)
    )


def blockish(a: Answer, b: Answer) -> bool:
    """Whether ``a`` looks like the block of the two: a block page by its maker's signs,
    a redirect away where ``b`` is a page, a page far shorter than ``b``'s and titled
    otherwise, or, not far longer than ``b``, a title with a block's words where
    ``b``'s has none."""
    if a.sign:
        return True
    if 300 <= a.status < 400 and 200 <= b.status < 300:
        return True
    if not (200 <= a.status < 300):
        return False
    a_title, b_title = a.look.title, b.look.title
    if a.size * FAR <= b.size and a_title != b_title:
        return True
    if a.size >= FAR * b.size:  # a block page is short: a block word in a long page's
        return False  # title is its subject, or its site's name (example-captcha.com)
    a_title, b_title = unnamed(a_title), unnamed(b_title)
    return bool(_BLOCK_WORDS.search(a_title)) and not _BLOCK_WORDS.search(b_title)


# A page this many times shorter than another answer to the same request is another
# class, and the shorter one's the block where their titles differ too.
FAR = 4
_BLOCK_WORDS = re.compile(
    rb"captcha|challenge|blocked|denied|verify|verification|unusual|robot|security check|"
    rb"just a moment|attention required|are you human|access"
)


def page_title(head: bytes) -> bytes:
    """A page's title, lower case, spaces folded, its first 200 bytes ("" when it has
    none), its tags in any case (``<TITLE>``, as older servers and appliances write
    it). The title of a class's kept form (``compared``: this, in its tags) is this
    again, so every answer of a page is of the class it made."""
    if not head:  # no page read (not HTML)
        return b""
    title = title_of(head)
    if not title and b"<title" not in head:  # the page lower-cased only then
        title = title_of(head.lower())
    title = title.lower().partition(b"</title")[0]  # a ``</TITLE>`` ends it too
    return b" ".join(title.split())[:200].rstrip()  # a cut just after a word


def url_on_site(url: str, site: str) -> bool:
    """Whether ``url`` is an http(s) URL of at most 2,048 characters whose host is
    ``site`` or under it (an operator's URL of its target)."""
    if len(url) > 2_048:
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    return parts.scheme in ("http", "https") and (host == site or host.endswith("." + site))


def path_of(url: str) -> str:
    """What a request to ``url`` asks of its host: its path and query ("/" at least)."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def redirect_target(answer: Answer) -> str:
    """Where a redirect goes (its path), "" for any other answer."""
    if not (300 <= answer.status < 400 and answer.location):
        return ""
    return urlsplit(answer.location).path or "/"


def _far_apart(a: int, b: int) -> bool:
    return max(a, b) > FAR * max(min(a, b), 1)


def read(rule: SiteRule | None, answer: Answer, others: Iterable[Answer]) -> str:
    """The verdict of ``answer``: by the site's ``rule`` when it has one and an answer
    came; else as a site without a rule, against what ``others`` got."""
    if rule is not None and not answer.closed:
        return verdict(rule, answer)
    return generic(answer, others)


def rule_for(site: str, rules: Iterable[SiteRule]) -> SiteRule | None:
    """The operator's rule for ``site``, else the built-in one, else None (generic)."""
    for rule in rules:
        if rule.site == site:
            return rule
    return _BUILTIN.get(site)


# The six large sites the public checkers test, read as they turn bots away: (site,
# statuses that turn away, words of their block pages, redirect paths, a page's least size).
_SIX: tuple[tuple[str, tuple[int, ...], tuple[str, ...], tuple[str, ...], int], ...] = (
    # Not "/recaptcha/": google.de's own home page loads its script (recorded).
    ("google.com", (403, 429), ("our systems have detected unusual traffic",), ("/sorry/",), 0),
    ("reddit.com", (403, 429), ("whoa there, pardner", "you've been blocked by network security"),
     ("/login",), 0),
    ("amazon.com", (403, 503), ("/errors/validatecaptcha", "to discuss automated access to amazon"),
     (), 2_048),
    ("instagram.com", (401, 403, 429), ("please wait a few minutes before you try again",),
     ("/accounts/login", "/challenge/"), 0),
    ("tiktok.com", (403, 429), ("captcha-verify", "verify to continue"), (), 4_096),
    ("discord.com", (403, 429), ("error code: 1015", "being rate limited", "cf-error-details"),
     (), 0),
)  # fmt: skip
BUILTIN_RULES = tuple(
    SiteRule(site=site, blocked=blocked, markers=markers, redirects=redirects, min_bytes=least)
    for site, blocked, markers, redirects, least in _SIX
)
_BUILTIN = {rule.site: rule for rule in BUILTIN_RULES}
