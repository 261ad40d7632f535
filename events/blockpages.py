"""Block pages by the signs their makers leave, whatever the site: the anti-bot vendors'
challenge and block pages, and a short page that calls itself a block.

A site's own page with a vendor's protection on it carries the vendor's scripts too (a
Cloudflare site's ``/cdn-cgi/challenge-platform/scripts/jsd/``, DataDome's
``js.datadome.co`` tag, PerimeterX's ``_pxAppId``, an ``_Incapsula_Resource`` script), so
none of those is a sign: a sign is what only the page that stops a client has. Each is
from its maker's public description of the page (named beside it); read in the first
``SIGN_BYTES`` of the page, after its ``Content-Encoding`` (events/pages.py), and in the
answer's headers. ``READER_VERSION`` names this reading: every round of verdicts carries
it, as it carries the public suffix list's version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "READER_VERSION",
    "SHORT_PAGE",
    "SIGNS",
    "SIGN_BYTES",
    "SIGN_HEADERS",
    "Sign",
    "block_sign",
    "title_of",
    "unnamed",
]

# 2: classes need a comparison; host names in titles. 3: the recorded pages' signs
# (Cloudflare's older pages, Sucuri's), and google.com's rule without "/recaptcha/".
# 4: a title's tag in any case (events/sites.py ``page_title``). 5: a title ends at its
# closing tag in any case, and a cut after a word keeps no space: a class's kept form
# (``compared``) read again gave another title, and its own page another class.
READER_VERSION = "blockpages-5"
SIGN_BYTES = 16 * 1024  # a block page says what it is in its head and first lines
# A page this short whose title is a block's is one (a site's own page says more).
SHORT_PAGE = 32 * 1024


class Sign(NamedTuple):
    """A block page of ``maker``: its body holds one of ``any_of`` and all of ``all_of``
    (lower case), or its headers hold ``header`` (name, a value it contains)."""

    maker: str
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    header: tuple[str, str] = ("", "")


SIGNS: tuple[Sign, ...] = (
    # Cloudflare: "cf-mitigated: challenge" on every challenge answer (developers.
    # cloudflare.com, "Detect a Challenge Page response"); the challenge page's own
    # options object and orchestration path; the block page "Sorry, you have been
    # blocked" and the 1020 "Access denied" page (its "Cloudflare Ray ID" footer).
    Sign("cloudflare", header=("cf-mitigated", "challenge")),
    Sign("cloudflare", any_of=("window._cf_chl_opt", "/cdn-cgi/challenge-platform/h/")),
    Sign("cloudflare", any_of=("sorry, you have been blocked", "error code: 1020"),
         all_of=("cloudflare",)),
    # Its older pages, as recorded (tests/fixtures/recorded): the challenge forms' own
    # actions and tokens, and the 1006-1008 page's title ("... used Cloudflare to
    # restrict access").
    Sign("cloudflare", any_of=("/cdn-cgi/l/chk_captcha", "/cdn-cgi/l/chk_jschl",
         "__cf_chl_captcha_tk__", "__cf_chl_jschl_tk__", "used cloudflare to restrict access")),
    # Akamai: "Access Denied ... You don't have permission to access ... Reference #"
    # (its edge's error page, errors.edgesuite.net).
    Sign("akamai", any_of=("errors.edgesuite.net", "reference&#32;&#35;"),
         all_of=("access denied",)),
    # DataDome: the block page loads its captcha from captcha-delivery.com (a protected
    # site's own pages load js.datadome.co instead).
    Sign("datadome", any_of=("captcha-delivery.com",)),
    # PerimeterX / HUMAN: the block page's "px-captcha" element ("Press & Hold").
    Sign("perimeterx", any_of=('id="px-captcha"', "px-captcha-wrapper", "press &amp; hold")),
    # Imperva / Incapsula: "Request unsuccessful. Incapsula incident ID".
    Sign("imperva", any_of=("incapsula incident id", "request unsuccessful. incapsula")),
    # AWS WAF: "x-amzn-waf-action: captcha" (or "challenge") on the CAPTCHA and challenge
    # answers (docs.aws.amazon.com, "CAPTCHA and Challenge actions").
    Sign("aws-waf", header=("x-amzn-waf-action", "captcha")),
    Sign("aws-waf", header=("x-amzn-waf-action", "challenge")),
    # Sucuri's website firewall: its JavaScript challenge sets its cookie by a script
    # named so (recorded). Not the firewall's name: an article about it says that too.
    Sign("sucuri", any_of=("sucuri_cloudproxy_js",)),
)  # fmt: skip

# The headers an edge keeps of an answer for ``block_sign`` (lower case, as bytes).
SIGN_HEADERS = frozenset(sign.header[0].encode() for sign in SIGNS if sign.header[0])
# Titles a page that stops a client calls itself by.
_TITLE_WORDS = (
    "access denied", "attention required", "just a moment", "are you a robot",
    "are you human", "verify you are human", "security check", "unusual traffic",
    "captcha", "blocked", "bot check", "request unsuccessful", "pardon our interruption",
)  # fmt: skip


def block_sign(page: bytes, size: int, headers: Iterable[tuple[str, str]] = ()) -> str:
    """The maker of the block page ``page`` is (its first bytes, decoded; ``size`` the
    whole body's), "page" for a short one that calls itself a block by its title (a
    captcha's, a challenge's); "" for none. Read once at every HTML answer the endpoint
    carries (events/sites.py ``Answer.sign``): a find of each sign's text, not one
    expression of them all (docs/decisions.md, The endpoint)."""
    if not page and not headers:  # no page read (not HTML) and no header to tell one
        return ""
    for name, value in headers:
        for maker, sign_name, sign_value in _HEADER_SIGNS:
            if name.lower() == sign_name and sign_value in value.lower():
                return maker
    text = page[:SIGN_BYTES].lower()
    for maker, any_of, all_of in _BODY_SIGNS:
        if any(m in text for m in any_of) and all(m in text for m in all_of):
            return maker
    if size <= SHORT_PAGE and (title := title_of(text)) and _BLOCK_TITLE.search(unnamed(title)):
        return "page"
    return ""


_HOST_NAME = re.compile(rb"[\w-]+(?:\.[\w-]+)+")


def unnamed(title: bytes) -> bytes:
    """A title without the host names in it: a site's name is no block's word, though
    it may hold one (``example-captcha.com``, ``access.example.net``)."""
    return _HOST_NAME.sub(b" ", title) if b"." in title else title


_HEADER_SIGNS = tuple((s.maker, *s.header) for s in SIGNS if s.header[0])
_BODY_SIGNS = tuple(
    (s.maker, tuple(m.encode() for m in s.any_of), tuple(m.encode() for m in s.all_of))
    for s in SIGNS
    if s.any_of
)
_BLOCK_TITLE = re.compile(b"|".join(re.escape(w.encode()) for w in _TITLE_WORDS))


def title_of(text: bytes) -> bytes:
    """A page's title as written ("" when it has none)."""
    start = text.find(b"<title")
    if start < 0:
        return b""
    start = text.find(b">", start) + 1
    end = text.find(b"</title", start)
    return text[start:end] if 0 < start <= end else b""
