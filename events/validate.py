"""Facts checked in one place: what a field of an event may hold, beyond its type.

msgspec already holds every field to its type; this module holds it to sense: protocols
and anonymity from their sets, latencies and sizes in range, ``exit_ip`` an address,
URLs http(s) with a host that can be public (unless the settings say lab), no control
characters, lengths capped, at most ``MAX_URLS`` URLs a ``Discovered``. The gateway asks
it before publishing what a caller sent, and the fold before applying what the log holds
(from the ``Configured`` that switches ``agent_subjects`` on, so older logs replay as they
did), so both refuse the same events with the same reason. Pure: no I/O, no clock.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from events.address import embedded_ipv4, internal_name, proxy_address_ok, public
from events.batches import MAX_RESULTS
from events.catalogue import (
    CheckResult,
    Deposited,
    Discovered,
    Event,
    Extracted,
    Fetched,
    Located,
    ProxiesChecked,
    ProxyFailed,
    ProxyReported,
    ProxyWorked,
    SiteRuled,
    SitesChecked,
    SourceAdded,
)
from events.hosts import rules_host, spelled_address
from events.ids import uuid7_ms
from events.keys import DERIVED_PREFIX, parse_key
from events.sites import HEAD_BYTES, site_key_ok, url_on_site
from events.subjects import url_id

__all__ = [
    "MAX_URLS",
    "PROTOS",
    "host_can_be_public",
    "id_problem",
    "legacy_ipv4",
    "local_name",
    "problem",
    "result_problems",
    "url_problem",
]

PROTOS = frozenset({"http", "https", "socks4", "socks5"})
MAX_URLS = 50  # URLs a Discovered may carry: a page links to more, a worker sends the best
MAX_CANDIDATES = 1_000  # an Extracted's sample (agents/worker.py sends at most this)
MAX_URL = 2_048
MAX_TEXT = 500  # error texts
MAX_NAME = 256  # judges, keys, extractor versions
MAX_LATENCY_MS = 600_000
MAX_BYTES = 1 << 30

_HEXDIGITS = "0123456789abcdef"
_PROTO_REASON = f"not one of {', '.join(sorted(PROTOS))}"
_IPV4 = re.compile(
    r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}"
)
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa", ".localdomain")


def _text(value: str, cap: int) -> str:
    if len(value) > cap:
        return f"longer than {cap} characters"
    # isprintable() is False for control (Cc), format (Cf: direction overrides,
    # zero-width) and separator characters other than the space: all in C.
    if not value.isprintable():
        return "holds a control, format or direction character"
    return ""


def _address(value: str) -> bool:
    if _IPV4.fullmatch(value):
        return True
    if ":" not in value:
        return False
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def legacy_ipv4(host: str) -> str | None:
    """``host`` as a dotted quad when it is an address in any notation ``inet_aton``
    (and so curl, browsers and most proxies) reads: decimal ``2130706433``, hex
    ``0x7f.1``, octal ``0177.0.0.1``, short ``127.1``; None when it is a name. Written
    out: the core imports no socket module."""
    if not host or not host[0].isdigit():
        return None
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts):
        return None
    values = []
    for part in parts:
        if not (part.isascii() and part.isalnum()):  # no signs, spaces or "_" int() takes
            return None
        try:
            if part.lower().startswith("0x"):
                values.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                values.append(int(part, 8))
            else:
                values.append(int(part, 10))
        except ValueError:
            return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (5 - len(values))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (24 - 8 * i)
    return str(ipaddress.IPv4Address(number))


def host_can_be_public(host: str, *, guarded: bool = False, rule: int = 0) -> bool:
    """Whether ``host`` (a URL's, without port) could be on the public internet: not an
    address the address rule refuses (events/address.py) in any notation, not
    ``localhost``, a single label or an internal suffix. ``guarded``: nor an IPv6 address
    that carries a non-public IPv4, nor a name that spells one for wildcard DNS
    (events/hosts.py); from rule 1 always so. Names are not resolved here."""
    host = host.strip("[]").rstrip(".").lower()
    if not host:
        return False
    literal = legacy_ipv4(host)
    if literal is None and ":" in host:
        literal = host
    if literal is not None:
        try:
            address = ipaddress.ip_address(literal)
        except ValueError:
            return False
        if rule:
            return public(address, rule=rule)
        inside = embedded_ipv4(address, 0) if isinstance(address, ipaddress.IPv6Address) else ()
        if guarded and not all(public(inner, rule=0) for inner in inside):
            return False
        return public(address, rule=0)
    if internal_name(host) if rule else local_name(host):
        return False
    if guarded or rule:
        spelled = spelled_address(host)
        return spelled is None or public(spelled, rule=rule)
    return True


def local_name(host: str) -> bool:
    """Address rule 0's internal names: ``localhost``, a single label (``intranet``), or
    a name under one of its few local suffixes (rule 1: ``address.internal_name``)."""
    name = host.rstrip(".").lower()
    return "." not in name or name.endswith(_LOCAL_SUFFIXES)


def url_problem(url: str, *, lab: bool, guarded: bool = False, rule: int = 0) -> str:
    """Why ``url`` may not be a source ("" when it may). ``guarded`` (or address rule 1):
    its host is judged by what it reaches (events/hosts.py), not only by its spelling."""
    if why := _text(url, MAX_URL):
        return why
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or 'none'!r}: only http and https"
    host = parts.hostname or ""
    if not host:
        return "no host"
    if guarded or rule:
        host, why = rules_host(host)
        if why:
            return why
        if not host:
            return "no host"
    if not lab and not host_can_be_public(host, guarded=guarded, rule=rule):
        return f"host {host!r} cannot be public"
    return ""


_OK = ("", "")


class Admit(NamedTuple):
    """What the address rule admits: lab mode, and the rule's revision (``address_rule``)."""

    lab: bool
    rule: int


def _hex(value: str, length: int) -> bool:
    """Lower-case hex of exactly ``length`` digits (``strip`` with a set runs in C)."""
    return len(value) == length and not value.strip(_HEXDIGITS)


def _proxy_fields(ip: str, port: int, admit: Admit) -> tuple[str, str]:
    """An address that can be a public proxy (events/address.py), named by its field:
    the rule the fold applies when it admits a proxy, asked up front once ``guarded``."""
    if not 0 < port <= 65535:
        return "port", "out of range 1-65535"
    if not proxy_address_ok(ip, port, lab=admit.lab, rule=admit.rule):
        return "ip", "not an address a public proxy can have" + (
            "" if admit.lab else " (outside lab mode)"
        )
    return _OK


def _worked_fields(e: ProxyWorked | CheckResult, admit: Admit, guarded: bool) -> tuple[str, str]:
    """The facts of one confirmation, whether a single event's or a round's result."""
    if guarded and (found := _proxy_fields(e.ip, e.port, admit))[1]:
        return found
    if e.proto not in PROTOS:
        return "proto", _PROTO_REASON
    if not 0 <= e.latency_ms <= MAX_LATENCY_MS:
        return "latency_ms", f"out of range 0-{MAX_LATENCY_MS}"
    # An exit that is the proxy itself needs no second look: the proxy's address is
    # checked where the proxy is admitted (reducers/proxies.py).
    if e.exit_ip and e.exit_ip != e.ip and not _address(e.exit_ip):
        return "exit_ip", "not an address"
    if e.judge and (why := _text(e.judge, MAX_NAME)):
        return "judge", why
    return _OK


def _failed_fields(e: ProxyFailed | CheckResult, admit: Admit, guarded: bool) -> tuple[str, str]:
    """The facts of one failed check, whether a single event's or a round's result."""
    if guarded and (found := _proxy_fields(e.ip, e.port, admit))[1]:
        return found
    if e.proto not in PROTOS:
        return "proto", _PROTO_REASON
    if e.error and (why := _text(e.error, MAX_TEXT)):
        return "error", why
    return _OK


def _proxy_worked(e: ProxyWorked, admit: Admit, guarded: bool) -> tuple[str, str]:
    field, why = _worked_fields(e, admit, guarded)
    if why:
        return field, why
    if e.source and not _hex(e.source, 16):
        return "source", "not a url_id"
    return _envelope(e.id, e.lease)


def _proxy_failed(e: ProxyFailed, admit: Admit, guarded: bool) -> tuple[str, str]:
    field, why = _failed_fields(e, admit, guarded)
    if why:
        return field, why
    return _envelope(e.id, e.lease)


def _proxy_reported(e: ProxyReported, admit: Admit, guarded: bool) -> tuple[str, str]:
    if guarded and (found := _proxy_fields(e.ip, e.port, admit))[1]:
        return found
    if e.detail and (why := _text(e.detail, MAX_TEXT)):
        return "detail", why
    if (e.outcome == "blocked") != bool(e.site):
        return "site", 'a site with "blocked", and only with it'
    if e.site and not site_key_ok(e.site):
        return "site", "not a site key (a lower-case name or an address)"
    return _envelope(e.id, "")


def _fetched(e: Fetched, admit: Admit, guarded: bool) -> tuple[str, str]:
    if not _hex(e.url_id, 16):
        return "url_id", "not a url_id"
    if not 0 <= e.http_status <= 999:
        return "http_status", "out of range 0-999"
    if not 0 <= e.bytes <= MAX_BYTES:
        return "bytes", f"out of range 0-{MAX_BYTES}"
    if not 0 <= e.fetch_ms <= MAX_LATENCY_MS:
        return "fetch_ms", f"out of range 0-{MAX_LATENCY_MS}"
    if e.error and (why := _text(e.error, MAX_TEXT)):
        return "error", why
    if why := _text(e.content_hash, 128):
        return "content_hash", why
    return _envelope(e.id, e.lease)


def _extracted(e: Extracted, admit: Admit, guarded: bool) -> tuple[str, str]:
    if not _hex(e.url_id, 16):
        return "url_id", "not a url_id"
    if not 0 <= e.count <= 10_000_000:
        return "count", "out of range"
    if len(e.candidates) > MAX_CANDIDATES:
        return "candidates", f"more than {MAX_CANDIDATES}"
    for ip, port, proto, confidence in e.candidates:
        if not _address(ip) or not 0 < port <= 65535:
            return "candidates", f"not an address: {ip[:50]!r}:{port}"
        if proto and proto not in PROTOS:
            return "candidates", f"protocol {proto[:20]!r}"
        if not 0.0 <= confidence <= 1.0:
            return "candidates", "confidence out of range 0-1"
    if why := _text(e.extractor, MAX_NAME):
        return "extractor", why
    if why := _text(e.content_hash, 128):
        return "content_hash", why
    return _envelope(e.id, e.lease)


def _discovered(e: Discovered, admit: Admit, guarded: bool) -> tuple[str, str]:
    if not _hex(e.parent, 16):
        return "parent", "not a url_id"
    if len(e.urls) > MAX_URLS:
        return "urls", f"more than {MAX_URLS}"
    for url in e.urls:
        if why := url_problem(url, lab=admit.lab, guarded=guarded, rule=admit.rule):
            return "urls", f"{url[:100]!r}: {why}"
    return _envelope(e.id, "")


def _source_added(e: SourceAdded, admit: Admit, guarded: bool) -> tuple[str, str]:
    if why := url_problem(e.url, lab=admit.lab, guarded=guarded, rule=admit.rule):
        return "url", why
    if e.url_id != url_id(e.url):
        return "url_id", "not the url_id of url"
    return _envelope(e.id, "")


def _deposited(e: Deposited, admit: Admit, guarded: bool) -> tuple[str, str]:
    if why := _text(e.key, MAX_URL):
        return "key", why
    if not _hex(e.sha256, 64):
        return "sha256", "not a SHA-256 in hex"
    parts = parse_key(e.key)
    if parts is None:
        return "key", "not <plan>/<range>/<cursor>, page/<sha256> or input/<sha256>"
    if parts.sha256 and parts.sha256 != e.sha256:
        return "sha256", "not the digest its content key names"
    if e.items < 0 or (e.cursor is not None and e.cursor < 0):
        return "items" if e.items < 0 else "cursor", "negative"
    if not 0 <= e.bytes <= MAX_BYTES:
        return "bytes", f"out of range 0-{MAX_BYTES}"
    return _envelope(e.id, e.lease)


_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _proxies_checked(e: ProxiesChecked, admit: Admit, guarded: bool) -> tuple[str, str]:
    """The round's envelope; its results are each checked as the single event they
    stand for (``result_problems``), so one bad result costs only itself."""
    if not _KEY.fullmatch(e.key):
        return "key", "not a partition key (1-64 of A-Z a-z 0-9 _ -)"
    if e.source and not _hex(e.source, 16):
        return "source", "not a url_id"
    if e.source and e.key != e.source:
        return "key", "a round of one source is keyed by its url_id"
    if not 1 <= len(e.results) <= MAX_RESULTS:
        return "results", f"1 to {MAX_RESULTS} results"
    return _envelope(e.id, e.lease)


def _sites_checked(e: SitesChecked, admit: Admit, guarded: bool) -> tuple[str, str]:
    """A round of site verdicts, whole: one bad result refuses the round (a new event,
    held to every rule from its first message)."""
    if not _KEY.fullmatch(e.key):
        return "key", "not a partition key (1-64 of A-Z a-z 0-9 _ -)"
    if not 1 <= len(e.results) <= MAX_RESULTS:
        return "results", f"1 to {MAX_RESULTS} results"
    if e.psl and (why := _text(e.psl, 64)):
        return "psl", why
    for j, r in enumerate(e.results):
        field, why = _proxy_fields(r.ip, r.port, admit)
        if why:
            return f"results[{j}].{field}", why
        if not site_key_ok(r.site):
            return f"results[{j}].site", "not a site key (a lower-case name or an address)"
        for name in ("through", "blocked", "latency_ms", "bytes"):
            if not 0 <= getattr(r, name) <= _MAX_COUNT:
                return f"results[{j}].{name}", f"out of range 0-{_MAX_COUNT}"
        if not 0 <= r.status <= 5:
            return f"results[{j}].status", "a status class, 0-5"
    return _envelope(e.id, e.lease)


_MAX_COUNT = 2**31 - 1


def _site_ruled(e: SiteRuled, admit: Admit, guarded: bool) -> tuple[str, str]:
    rule = e.rule
    if not site_key_ok(rule.site):
        return "rule.site", "not a site key (a lower-case name or an address)"
    for name in ("through", "blocked"):
        codes = getattr(rule, name)
        if len(codes) > 32 or not all(100 <= c <= 599 for c in codes):
            return f"rule.{name}", "at most 32 HTTP statuses, 100-599"
    for name in ("markers", "redirects"):
        texts = getattr(rule, name)
        if len(texts) > 16 or not all(0 < len(t) <= 200 for t in texts):
            return f"rule.{name}", "at most 16, each 1-200 characters"
    if not all(r.startswith("/") for r in rule.redirects):
        return "rule.redirects", "paths, each starting with /"
    if not 0 <= rule.min_bytes <= HEAD_BYTES * 16:
        return "rule.min_bytes", f"out of range 0-{HEAD_BYTES * 16}"
    if e.url and not url_on_site(e.url, rule.site):
        return "url", "an http or https URL on the site itself, at most 2,048 characters"
    return _envelope(e.id, "")


def _located(e: Located, admit: Admit, guarded: bool) -> tuple[str, str]:
    if len(e.more) >= MAX_RESULTS:
        return "more", f"at most {MAX_RESULTS} addresses in all"
    for i, place in enumerate(e.more):
        if not _address(place.ip):
            return f"more[{i}].ip", "not an address"
        if why := _text(place.as_org, MAX_NAME) or _text(place.country, 2):
            return f"more[{i}]", why
    return _envelope(e.id, "")


def result_problems(
    batch: ProxiesChecked, *, lab: bool, guarded: bool = False, rule: int = 0
) -> list[tuple[int, str, str]]:
    """(index, field, why) of each result of ``batch`` that is wrong, as the single event
    it stands for would be (its envelope is the round's, checked by ``problem``); the
    field reads ``results[j].<field>``."""
    admit = Admit(lab, rule)
    out = []
    for j, r in enumerate(batch.results):
        field, why = (
            _worked_fields(r, admit, guarded) if r.ok else _failed_fields(r, admit, guarded)
        )
        if why:
            out.append((j, f"results[{j}].{field}", why))
    return out


def _envelope(event_id: str, lease: str) -> tuple[str, str]:
    if lease and (why := _text(lease, 64)):
        return "lease", why
    if why := _text(event_id, 64):
        return "id", why
    return _OK


_CHECKS: dict[type, Callable[[Any, Admit, bool], tuple[str, str]]] = {
    ProxyWorked: _proxy_worked,
    ProxyFailed: _proxy_failed,
    ProxyReported: _proxy_reported,
    Fetched: _fetched,
    Extracted: _extracted,
    Discovered: _discovered,
    SourceAdded: _source_added,
    Deposited: _deposited,
    ProxiesChecked: _proxies_checked,
    SitesChecked: _sites_checked,
    SiteRuled: _site_ruled,
    Located: _located,
}


def problem(event: Event, *, lab: bool, guarded: bool = False, rule: int = 0) -> tuple[str, str]:
    """(field, why) of the first thing wrong with ``event``; ("", "") when nothing is.
    ``guarded`` and ``rule`` (``address_rule``): the settings of those names
    (events/catalogue.py Settings). A table by type, not a chain of isinstance: the fold
    asks it of every event."""
    check = _CHECKS.get(type(event))
    if check is None:
        return _envelope(event.id, "")
    return check(event, Admit(lab, rule), guarded)


def id_problem(event_id: str, at_ms: int, skew_ms: int) -> str:
    """Why an agent's observation id may not be folded at time ``at_ms`` (its message's
    log time; the gateway's clock before it publishes): not a UUIDv7, or dated more
    than ``skew_ms`` past it. "" when it may. A future id would sit above every honest
    one in its agent's re-send mark; the prefix of the ids the fold derives from a
    deposit (events/keys.py) would pass it by."""
    if event_id.startswith(DERIVED_PREFIX):
        return f"{DERIVED_PREFIX!r} starts only the ids the fold derives from deposits"
    dated = uuid7_ms(event_id)
    if dated < 0:
        return "not a UUIDv7 (RFC 9562) in its canonical form"
    ahead = dated - at_ms
    if ahead > skew_ms:
        return (
            f"dated {ahead} ms past its message's time (skew allowed: {skew_ms} ms):"
            " is the agent's clock right?"
        )
    return ""
