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
from urllib.parse import urlsplit

from events.catalogue import (
    Deposited,
    Discovered,
    Event,
    Extracted,
    Fetched,
    ProxyFailed,
    ProxyWorked,
    SourceAdded,
)
from events.subjects import url_id

__all__ = ["MAX_URLS", "PROTOS", "host_can_be_public", "problem", "url_problem"]

PROTOS = frozenset({"http", "https", "socks4", "socks5"})
MAX_URLS = 50  # URLs a Discovered may carry: a page links to more, a worker sends the best
MAX_CANDIDATES = 1_000  # an Extracted's sample (agents/worker.py sends at most this)
MAX_URL = 2_048
MAX_TEXT = 500  # error texts
MAX_NAME = 256  # judges, keys, extractor versions
MAX_LATENCY_MS = 600_000
MAX_BYTES = 1 << 30

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0080-\u009f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_IPV4 = re.compile(
    r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}"
)
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa", ".localdomain")


def _text(value: str, cap: int) -> str:
    if len(value) > cap:
        return f"longer than {cap} characters"
    if _CONTROL.search(value):
        return "holds a control or direction character"
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


def _legacy_ipv4(host: str) -> str | None:
    """``host`` as a dotted quad when it is an address in any notation ``inet_aton``
    reads (decimal ``2130706433``, hex ``0x7f.1``, octal ``0177.0.0.1``, short ``127.1``),
    else None. Written out: the core imports no socket module."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts):
        return None
    values = []
    for part in parts:
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


def host_can_be_public(host: str) -> bool:
    """Whether ``host`` (a URL's, without port) could be on the public internet: not a
    private, loopback, link-local or reserved address in any notation, not
    ``localhost``, a single label or a local suffix. Names are not resolved here."""
    host = host.strip("[]").rstrip(".").lower()
    if not host:
        return False
    literal = _legacy_ipv4(host) if host[0].isdigit() else None
    if literal is None and ":" in host:
        literal = host
    if literal is not None:
        try:
            return ipaddress.ip_address(literal).is_global
        except ValueError:
            return False
    return "." in host and not host.endswith(_LOCAL_SUFFIXES)


def url_problem(url: str, *, lab: bool) -> str:
    """Why ``url`` may not be a source ("" when it may)."""
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
    if not lab and not host_can_be_public(host):
        return f"host {host!r} cannot be public"
    return ""


def problem(event: Event, *, lab: bool) -> tuple[str, str]:
    """(field, why) of the first thing wrong with ``event``; ("", "") when nothing is."""
    match event:
        case ProxyWorked():
            if event.proto not in PROTOS:
                return "proto", f"not one of {', '.join(sorted(PROTOS))}"
            if not 0 <= event.latency_ms <= MAX_LATENCY_MS:
                return "latency_ms", f"out of range 0-{MAX_LATENCY_MS}"
            if event.exit_ip and not _address(event.exit_ip):
                return "exit_ip", "not an address"
            if event.source and not _HEX16.fullmatch(event.source):
                return "source", "not a url_id"
            if why := _text(event.judge, MAX_NAME):
                return "judge", why
            return _common(event)
        case ProxyFailed():
            if event.proto not in PROTOS:
                return "proto", f"not one of {', '.join(sorted(PROTOS))}"
            if why := _text(event.error, MAX_TEXT):
                return "error", why
            return _common(event)
        case Fetched():
            if not _HEX16.fullmatch(event.url_id):
                return "url_id", "not a url_id"
            if not 0 <= event.http_status <= 999:
                return "http_status", "out of range 0-999"
            if not 0 <= event.bytes <= MAX_BYTES:
                return "bytes", f"out of range 0-{MAX_BYTES}"
            if not 0 <= event.fetch_ms <= MAX_LATENCY_MS:
                return "fetch_ms", f"out of range 0-{MAX_LATENCY_MS}"
            if why := _text(event.error, MAX_TEXT):
                return "error", why
            if why := _text(event.content_hash, 128):
                return "content_hash", why
            return _common(event)
        case Extracted():
            if not _HEX16.fullmatch(event.url_id):
                return "url_id", "not a url_id"
            if not 0 <= event.count <= 10_000_000:
                return "count", "out of range"
            if len(event.candidates) > MAX_CANDIDATES:
                return "candidates", f"more than {MAX_CANDIDATES}"
            for ip, port, proto, confidence in event.candidates:
                if not _address(ip) or not 0 < port <= 65535:
                    return "candidates", f"not an address: {ip[:50]!r}:{port}"
                if proto and proto not in PROTOS:
                    return "candidates", f"protocol {proto[:20]!r}"
                if not 0.0 <= confidence <= 1.0:
                    return "candidates", "confidence out of range 0-1"
            if why := _text(event.extractor, MAX_NAME):
                return "extractor", why
            if why := _text(event.content_hash, 128):
                return "content_hash", why
            return _common(event)
        case Discovered():
            if not _HEX16.fullmatch(event.parent):
                return "parent", "not a url_id"
            if len(event.urls) > MAX_URLS:
                return "urls", f"more than {MAX_URLS}"
            for url in event.urls:
                if why := url_problem(url, lab=lab):
                    return "urls", f"{url[:100]!r}: {why}"
            return _common(event)
        case SourceAdded():
            if why := url_problem(event.url, lab=lab):
                return "url", why
            if event.url_id != url_id(event.url):
                return "url_id", "not the url_id of url"
            return _common(event)
        case Deposited():
            if why := _text(event.key, MAX_URL):
                return "key", why
            if not _HEX64.fullmatch(event.sha256):
                return "sha256", "not a SHA-256 in hex"
            if not 0 <= event.bytes <= MAX_BYTES:
                return "bytes", f"out of range 0-{MAX_BYTES}"
            return _common(event)
    return _common(event)


def _common(event: Event) -> tuple[str, str]:
    lease = getattr(event, "lease", "")
    if lease and (why := _text(lease, 64)):
        return "lease", why
    if why := _text(event.id, 64):
        return "id", why
    return "", ""
