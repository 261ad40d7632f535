"""The proxy login: who is asking, and what they want of the pool, in the user name.

The user name is the consumer's agent name (``ppf token issue NAME --role consumer``),
then options, each a keyword and its value, all joined by ``-``; the password is the
consumer's token::

    shop                                  the endpoint's defaults
    shop-country-de-proto-socks5          a German SOCKS5 proxy
    shop-country-de,nl-anon-elite-https   elite, Germany or the Netherlands, HTTPS-capable
    shop-maxlat-800-session-a1b2          under 800 ms; keep the same upstream (sticky)
    shop-strategy-roundrobin-mitm         round robin; proxies seen tampering allowed

Keywords: ``country`` (ISO codes, comma-separated), ``proto`` (http, https, socks4,
socks5), ``anon`` (transparent, anonymous, elite), ``https`` (no value: only proxies
that tunnelled to a real HTTPS site), ``maxlat`` (ms), ``asn``, ``session`` (1-32
letters and digits: the same upstream while it works, ``sessmin`` minutes, default 10),
``strategy`` (weighted, roundrobin, lru), ``mitm`` (no value). Agent names may hold
``-``: the options start at the first keyword. Anything else is refused with its reason
(407: the client's login is wrong, not the pool). Pure.
"""

from __future__ import annotations

import base64
import difflib
import re
from dataclasses import dataclass

from endpoint.link.upstream import Upstream
from events import agent_name_ok

__all__ = [
    "CHALLENGE",
    "LOGIN_NEEDED",
    "STRATEGIES",
    "LoginError",
    "Want",
    "basic_login",
    "challenge",
    "parse_login",
    "wrong_login",
]

STRATEGIES = ("weighted", "roundrobin", "lru")
_FLAGS = frozenset({"https", "mitm"})
_VALUED = frozenset({"country", "proto", "anon", "maxlat", "asn", "session", "sessmin", "strategy"})
_KEYWORDS = _FLAGS | _VALUED
_SESSION = re.compile(r"[A-Za-z0-9]{1,32}")
_PROTOS = ("http", "https", "socks4", "socks5")
_ANON = ("transparent", "anonymous", "elite")


class LoginError(ValueError):
    """A login the endpoint cannot read; its text says what is wrong."""


@dataclass(frozen=True, slots=True)
class Want:
    """What a consumer asks of the pool for one request or tunnel."""

    consumer: str
    country: tuple[str, ...] = ()
    proto: str = ""
    anonymity: str = ""
    https: bool = False
    max_latency_ms: int = 0
    asn: int = 0
    mitm: bool = False
    session: str = ""
    session_min: int = 10
    strategy: str = "weighted"

    def filters(self) -> tuple[object, ...]:
        """The part of the login that selects proxies (a round robin's cursor is per this)."""
        return (
            self.country,
            self.proto,
            self.anonymity,
            self.https,
            self.max_latency_ms,
            self.asn,
            self.mitm,
        )

    def fits(self, up: Upstream, tunnel: bool) -> bool:
        """Whether ``up`` is what the login's filters ask for (a tunnel: one that can
        tunnel)."""
        if tunnel and not up.tunnels:
            return False
        if up.mitm and not self.mitm:
            return False
        if self.proto and up.proto != self.proto:
            return False
        if self.country and up.country not in self.country:
            return False
        if self.anonymity and up.anonymity != self.anonymity:
            return False
        if self.https and up.https != "yes":
            return False
        if self.max_latency_ms and up.latency_ms > self.max_latency_ms:
            return False
        return not (self.asn and up.asn != self.asn)


MAX_LOGIN = 512  # characters of a login's name and options


def parse_login(user: str) -> Want:
    if len(user) > MAX_LOGIN:
        raise LoginError(f"a login of more than {MAX_LOGIN} characters")
    parts = user.split("-")
    start = next((i for i, p in enumerate(parts) if i and p in _KEYWORDS), len(parts))
    name = "-".join(parts[:start])
    if not agent_name_ok(name):
        raise LoginError(f"not a consumer name: {name!r}")
    fields: dict[str, object] = {}
    i = start
    while i < len(parts):
        key = parts[i]
        if key not in _KEYWORDS:
            raise LoginError(f"unknown option {key!r} (options: {', '.join(sorted(_KEYWORDS))})")
        if key in _FLAGS:
            fields[key] = True
            i += 1
            continue
        if i + 1 >= len(parts) or not parts[i + 1]:
            raise LoginError(f"option {key!r} needs a value")
        fields[key] = _value(key, parts[i + 1])
        i += 2
    return Want(
        consumer=name,
        country=fields.get("country", ()),  # type: ignore[arg-type]
        proto=str(fields.get("proto", "")),
        anonymity=str(fields.get("anon", "")),
        https=bool(fields.get("https", False)),
        max_latency_ms=int(fields.get("maxlat", 0)),  # type: ignore[call-overload]
        asn=int(fields.get("asn", 0)),  # type: ignore[call-overload]
        mitm=bool(fields.get("mitm", False)),
        session=str(fields.get("session", "")),
        session_min=int(fields.get("sessmin", 10)),  # type: ignore[call-overload]
        strategy=str(fields.get("strategy", "weighted")),
    )


def _value(key: str, raw: str) -> object:
    if key == "country":
        codes = tuple(c.upper() for c in raw.split(",") if c)
        if not codes or any(len(c) != 2 or not c.isalpha() for c in codes):
            raise LoginError(f"country: ISO 3166 alpha-2 codes, comma-separated, not {raw!r}")
        return codes
    if key in ("maxlat", "asn", "sessmin"):
        if not raw.isdigit() or (key == "sessmin" and not 1 <= int(raw) <= 1440):
            raise LoginError(f"{key}: a number{' of minutes, 1-1440' if key == 'sessmin' else ''}")
        return int(raw)
    if key == "session" and not _SESSION.fullmatch(raw):
        raise LoginError("session: 1-32 letters and digits")
    choices = {"proto": _PROTOS, "anon": _ANON, "strategy": STRATEGIES}.get(key)
    if choices is not None and raw not in choices:
        raise LoginError(f"{key}: one of {', '.join(choices)}")
    return raw


# What a client without a valid login is told (407), plain HTTP and CONNECT alike.
LOGIN_NEEDED = "a consumer login is required: NAME[-options]:TOKEN"
CHALLENGE = b'Proxy-Authenticate: Basic realm="ppf"\r\n'


def wrong_login(user: str) -> str:
    """Why a login the gateways refused was refused, as its client may be told: the
    name or the token is wrong (never which, never the token), and an option the name
    seems to misspell (``shop-sesion-a1``: options start at the first keyword, so this
    reads as the consumer ``shop-sesion-a1``)."""
    said = f"no consumer {user[:64]!r} with this token: NAME[-options]:TOKEN"
    for part in user.split("-")[1:]:
        near = difflib.get_close_matches(part.lower(), sorted(_KEYWORDS), n=1, cutoff=0.75)
        if near and part not in _KEYWORDS:
            return f"{said} (is {part[:32]!r} meant as the option {near[0]!r}?)"
    return said


def challenge(why: str) -> bytes:
    """The 407's ``Proxy-Authenticate``, its realm saying ``why`` (what a client shows)."""
    realm = "".join(c for c in why if c.isprintable() and c not in '"\\')[:200]
    return b'Proxy-Authenticate: Basic realm="ppf: %s"\r\n' % realm.encode("ascii", "replace")


def basic_login(authorization: bytes) -> tuple[str, str] | None:
    """(user, password) of a ``Basic`` Proxy-Authorization, None for anything else."""
    scheme, _, encoded = authorization.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        user, _, password = base64.b64decode(encoded.strip()).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return user, password
