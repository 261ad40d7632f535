"""Proxy candidates out of whatever a proxy list looks like. Pure: text in, candidates out.

Formats: ``ip:port`` lines, ``proto://ip:port``, ``ip port`` columns, CSV and markdown
tables, HTML tables (ip and port in neighbouring cells), HTML grids of other elements
(ip and port in neighbouring ``div``/``span`` texts), addresses written base64-encoded
inside a script call (``document.write(Base64.decode("..."))``), JSON (any nesting of
objects with ip/host and port fields, or ``proxy`` strings). The protocol comes from the
line's scheme, the JSON field, a protocol word on the line, or the source's hint, in
that order; confidence says which.

Never mistaken for a proxy: times (``12:30:45``), dotted versions longer than four
parts, addresses that cannot be public (unless ``lab``), ports outside 1-65535.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from itertools import pairwise
from typing import Any, NamedTuple

import msgspec

from events.address import proxy_address_ok

try:
    from agents._scan import scan as _c_scan  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # built without a C compiler: _fast below applies the same rules
    _c_scan = None

__all__ = ["EXTRACTOR", "Candidate", "extract", "native_scanner"]

EXTRACTOR = "ppf-extract/1"

PROTOS = {
    "http": "http",
    "https": "https",
    "socks4": "socks4",
    "socks4a": "socks4",
    "socks5": "socks5",
    "socks5h": "socks5",
    "socks": "socks5",
}


class Candidate(NamedTuple):
    """A NamedTuple, not a dataclass: a dense list yields millions, and a frozen
    dataclass costs several times as much to build (docs/decisions.md, Agents)."""

    ip: str
    port: int
    proto: str | None
    confidence: float

    def __str__(self) -> str:
        addr = f"{self.ip}:{self.port}"
        return f"{self.proto}://{addr}" if self.proto else addr


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IP = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
# An address not glued to more digits or dots on either side (so no versions, no
# longer dotted runs), an optional scheme and user:pass@, then a port after ':' or
# after a column separator (spaces, tab, comma, semicolon, a markdown pipe). The
# user:pass part is bounded (64 characters each; a longer one leaves the address found,
# its protocol to be detected) and tried only on lines with an '@': unbounded, it
# rescans a long run of punctuated text from every position (docs/decisions.md).
_SCHEME = r"(?<![\w.])(?:(?P<scheme>[A-Za-z][A-Za-z0-9]*)://)?"
_USER = r"(?:[^\s:@/]{1,64}(?::[^\s@/]{0,64})?@)?"
_ADDR = rf"(?P<ip>{_IP})(?:(?P<colon>:)|[ \t]*[,;|\t][ \t]*|[ \t]+)(?P<port>\d{{1,5}})(?![\d.:])"
_TEXT = re.compile(_SCHEME + _ADDR)
_TEXT_USER = re.compile(_SCHEME + _USER + _ADDR)  # for lines with an '@' only
# A protocol word on a line (a "SOCKS5" column), not the scheme of another address on it.
_WORD = re.compile(
    r"(?<![A-Za-z0-9])(https?|socks4a?|socks5h?)(?![A-Za-z0-9])(?!://)", re.IGNORECASE
)
# HTML by splitting at tags, never by matching a tag to its closing one: HTML lets
# </tr> and </td> be left out, and a lazy `<tr>(.*?)</tr>` then scans to the end of the
# page from every row: quadratic in the page (docs/decisions.md). Every pattern
# here stops at the next '<', so a page costs time in proportion to its length.
_ROW_START = re.compile(r"<tr\b[^<>]*>", re.IGNORECASE)
_CELL_START = re.compile(r"<t[dh]\b[^<>]*>", re.IGNORECASE)
_CELL_END = re.compile(r"</t[dhr]\s*>|</table\s*>|</tbody\s*>", re.IGNORECASE)
_TAG = re.compile(r"<[^<>]*>")
_IP_ONLY = re.compile(rf"^\s*({_IP})\s*$")
# An address alone inside an element (a grid of spans): the fast path cannot read those.
_TAGGED_IP = re.compile(rb">\s*(?:\d{1,3}\.){3}\d{1,3}\s*<")
# A script whose one string literal is base64 (some lists hide addresses that way). The
# element is matched up to the next '<' only, like every HTML pattern here.
_SCRIPT = re.compile(r"<script\b[^<>]*>([^<]*)</script\s*>", re.IGNORECASE)
_B64 = re.compile(r"""["']([A-Za-z0-9+/]{8,88}={0,2})["']""")
_PORT_ONLY = re.compile(r"^\s*(\d{1,5})\s*$")
# Grids of elements (_nodes): a tag that marks its text as a port, how many texts on
# from an address its port may stand, and what may stand between where nothing is
# marked.
_PORT_MARK = re.compile(r"""[\s"'=_-]port\b""", re.IGNORECASE)
_NODE_REACH = 8
_SEPARATOR = re.compile(r"[\s:|,;/\\\-\u00b7\u2022]+")
# Header cells of a table's columns (_html).
_PORT_HEADER = re.compile(r"\s*port(?: number)?\s*")
_ADDR_HEADER = re.compile(r"\s*(?:ip|ip address|ip addr|address|host|proxy|proxy ip|server)\s*")

# The fast path, for the common dense list with no protocol words on its lines: one C
# scan that admits only public addresses and ports 1-65535, so no match needs a
# Python-level check (the reserved ranges of events.address, as a lookahead).
_NOT_PUBLIC = (
    rb"(?:0|10|127|22[4-9]|2[3-5]\d)\.|100\.(?:6[4-9]|[7-9]\d|1[01]\d|12[0-7])\."
    rb"|169\.254\.|172\.(?:1[6-9]|2\d|3[01])\.|192\.0\.[02]\.|192\.88\.99\.|192\.168\."
    rb"|198\.(?:1[89])\.|198\.51\.100\.|203\.0\.113\."
)
_OCT = rb"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_PORT = rb"(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3})"
_FAST = re.compile(
    rb"(?<![\w.])(?:([A-Za-z][A-Za-z0-9]*)://)?(?!"
    + _NOT_PUBLIC
    + rb")("
    + _OCT
    + rb"\."
    + _OCT
    + rb"\."
    + _OCT
    + rb"\."
    + _OCT
    + rb")(?:(:)|[ \t]*[,;|\t][ \t]*|[ \t]+)("
    + _PORT
    + rb")(?![\d.:])"
)
_BARE_WORD = re.compile(rb"(?i)(?<![a-z0-9])(?:https?|socks4a?|socks5h?)(?![a-z0-9])(?!://)")
_USERINFO = re.compile(rb"://[^\s/]*@")


_HEAD = re.compile(rb"\s*(.)", re.DOTALL)


def _plain(data: bytes) -> bool:
    """The fast path reads it right: not JSON, no HTML table cell, no protocol word
    outside a scheme, no user:pass@. Checked on bytes, before any decoding, because on a
    dense 30 MB list every copy of the text costs a visible share of the scan."""
    head = _HEAD.match(data)
    if head is not None and head[1] in b"[{":
        return False
    # One-byte probes first: they run at memchr speed, and a dense list has no '<'
    # and no letter of "http" or "socks" at all.
    low = data.lower() if b"<" in data or any(c in data for c in b"hHsS") else b""
    if b"<td" in low or (b"<" in data and _TAGGED_IP.search(data)):
        return False
    if b"<script" in low and b"base64" in low:
        return False
    if (b"http" in low or b"socks" in low) and _BARE_WORD.search(data):
        return False
    return not (b"@" in data and _USERINFO.search(data))


def native_scanner() -> bool:
    """Whether agents/_scan.c was built here (it needs a C compiler at install time)."""
    return _c_scan is not None


# What agents/_scan.c is given: protocols by its codes, and its five confidences.
_CODES: tuple[str | None, ...] = (None, "http", "https", "socks4", "socks5")
_CONFIDENCES = (1.0, 0.9, 0.8, 0.7, 0.6)


def _fast(data: bytes, hint: str | None) -> Iterator[Candidate]:
    """The regex twin of agents/_scan.c, and the fallback where it was not built."""
    for scheme, ip, colon, port in dict.fromkeys(_FAST.findall(data)):
        if scheme:
            proto = _proto(scheme.decode())
            if proto is None:
                continue
            yield Candidate(ip.decode(), int(port), proto, 1.0)
        elif colon:
            yield Candidate(ip.decode(), int(port), hint, 0.9 if hint else 0.8)
        else:
            yield Candidate(ip.decode(), int(port), hint, 0.7 if hint else 0.6)


_IP_KEYS = ("ip", "host", "address", "addr", "ip_address", "ipaddress", "server")
_PORT_KEYS = ("port",)
_PROTO_KEYS = ("protocol", "proto", "type", "protocols", "scheme")
_STRING_KEYS = ("proxy", "url", "address", "addr")


def _proto(word: str | None) -> str | None:
    return PROTOS.get(word.lower()) if word else None


def _valid_port(port: int) -> bool:
    return 0 < port <= 65535


def _text(text: str, hint: str | None, lab: bool) -> Iterator[Candidate]:
    for line in text.splitlines():
        if not any(c.isdigit() for c in line):
            continue
        word_proto: str | None = None
        word_checked = False
        for m in (_TEXT_USER if "@" in line else _TEXT).finditer(line):
            port = int(m["port"])
            ip = m["ip"]
            if not _valid_port(port) or not proxy_address_ok(ip, port, lab=lab):
                continue
            scheme = m["scheme"]
            if scheme is not None:
                proto = _proto(scheme)
                if proto is None:  # ftp://, rtsp://: not a proxy URL
                    continue
                yield Candidate(ip, port, proto, 1.0)
                continue
            if not word_checked:
                words = {_proto(w) for w in _WORD.findall(line)}
                word_proto = words.pop() if len(words) == 1 else None
                word_checked = True
            confidence = 0.9 if m["colon"] else 0.7
            if word_proto is not None:
                yield Candidate(ip, port, word_proto, confidence)
            else:
                yield Candidate(ip, port, hint, confidence if hint else confidence - 0.1)


def _unscript(text: str) -> str:
    """Scripts that write a base64 literal, replaced by what it decodes to when that is
    an address (or address:port): the page as a browser would show it."""

    def decoded(m: re.Match[str]) -> str:
        for literal in _B64.findall(m[1]):
            try:
                plain = base64.b64decode(literal, validate=True).decode("ascii").strip()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                continue
            if _IP_ONLY.match(plain.rpartition(":")[0] or plain):
                return plain
        return m[0]

    return _SCRIPT.sub(decoded, text)


def _nodes(text: str, hint: str | None, lab: bool) -> Iterator[Candidate]:
    """Any HTML: an address text, then its port text a few elements on (a grid of divs
    and spans). Where the page marks its ports (an element whose tag says ``port``: a
    class, an itemprop, a title), the first marked port before the next address is
    the address's, whatever stands between (a country, a latency, an uptime, a count).
    Otherwise the port is the next text, past separators (``:``, ``|``) and icons (no
    text at all) only: a word or another number between ends the search, since whose
    number it is cannot be told, and nothing is guessed."""
    texts: list[tuple[str, bool]] = []  # (text, inside an element marked as a port)
    at, tag_port = 0, False
    for m in _TAG.finditer(text):
        chunk = text[at : m.start()].strip()
        if chunk:
            texts.append((chunk, tag_port))
        if not m[0].startswith("</"):
            tag_port = bool(_PORT_MARK.search(m[0]))
        at = m.end()
    if tail := text[at:].strip():
        texts.append((tail, False))
    for i, (a, _) in enumerate(texts):
        ip_m = _IP_ONLY.match(a)
        if not ip_m:
            continue
        port = _marked_port(texts[i + 1 : i + 1 + _NODE_REACH])
        if port is None:
            port = _next_port(texts[i + 1 : i + 1 + _NODE_REACH])
        if port is not None and _valid_port(port) and proxy_address_ok(ip_m[1], port, lab=lab):
            yield Candidate(ip_m[1], port, hint, 0.8)


def _marked_port(after: list[tuple[str, bool]]) -> int | None:
    for b, is_port in after:
        if _IP_ONLY.match(b):
            return None  # the next address: a port after it is its own
        port_m = _PORT_ONLY.match(b)
        if port_m and is_port:
            return int(port_m[1])
    return None


def _next_port(after: list[tuple[str, bool]]) -> int | None:
    """The first number past separators, unless another number comes right after it
    (``42`` then ``8080``: which is the port cannot be told)."""
    texts = [b for b, _ in after if not _SEPARATOR.fullmatch(b)]
    if not texts or not (port_m := _PORT_ONLY.match(texts[0])):
        return None
    if len(texts) > 1 and _PORT_ONLY.match(texts[1]):
        return None
    return int(port_m[1])


def _html(text: str, hint: str | None, lab: bool) -> Iterator[Candidate]:
    """HTML tables: an address cell and the port cell beside it; or, where a header row
    names the columns (``Port``, and ``IP``/``Address``/``Host``/``Proxy``), those
    columns, whatever stands between them (flags, countries, uptimes, counts)."""
    columns: tuple[int, int] | None = None  # (address, port) from the last header row
    for row in _ROW_START.split(text)[1:]:
        cells = []
        for cell in _CELL_START.split(row)[1:]:
            end = _CELL_END.search(cell)
            cells.append(_TAG.sub("", cell[: end.start()] if end else cell).strip())
        header = _header(cells)
        if header is not None:
            columns = header
            continue
        words = {_proto(w) for c in cells for w in _WORD.findall(c)}
        row_proto = words.pop() if len(words) == 1 else hint
        if columns is not None and max(columns) < len(cells):
            pairs = [(cells[columns[0]], cells[columns[1]])]
        else:
            pairs = list(pairwise(cells))
        for a, b in pairs:
            ip_m, port_m = _IP_ONLY.match(a), _PORT_ONLY.match(b)
            if ip_m and port_m:
                ip, port = ip_m[1], int(port_m[1])
                if _valid_port(port) and proxy_address_ok(ip, port, lab=lab):
                    yield Candidate(ip, port, row_proto, 0.8)


def _header(cells: list[str]) -> tuple[int, int] | None:
    """(address column, port column) of a header row; None for any other row."""
    names = [c.lower() for c in cells]
    port = next((i for i, c in enumerate(names) if _PORT_HEADER.fullmatch(c)), None)
    addr = next((i for i, c in enumerate(names) if _ADDR_HEADER.fullmatch(c)), None)
    if port is None or addr is None or port == addr:
        return None
    return addr, port


def _json_walk(node: Any, hint: str | None, lab: bool) -> Iterator[Candidate]:
    if isinstance(node, list):
        for item in node:
            yield from _json_walk(item, hint, lab)
        return
    if not isinstance(node, dict):
        return
    lowered = {str(k).lower(): v for k, v in node.items()}
    ip = next((lowered[k] for k in _IP_KEYS if isinstance(lowered.get(k), str)), None)
    port = next((lowered[k] for k in _PORT_KEYS if k in lowered), None)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if ip is not None and isinstance(port, int) and not isinstance(port, bool):
        proto_field = next((lowered[k] for k in _PROTO_KEYS if k in lowered), None)
        if isinstance(proto_field, list):
            protos = [p for p in (_proto(str(x)) for x in proto_field) if p]
        else:
            protos = [p for p in [_proto(str(proto_field))] if p] if proto_field else []
        if _valid_port(port) and proxy_address_ok(ip.strip(), port, lab=lab):
            for p in protos or [hint or ""]:
                yield Candidate(ip.strip(), port, p, 1.0 if p and protos else 0.8)
        return  # a proxy object: its other fields (exit_ip, asn, geo) are not proxies
    for key in _STRING_KEYS:
        value = lowered.get(key)
        if isinstance(value, str):
            yield from _text(value, hint, lab)
    for value in node.values():
        if isinstance(value, (dict, list)):
            yield from _json_walk(value, hint, lab)


def extract(data: str | bytes, hint: str | None = None, *, lab: bool = False) -> list[Candidate]:
    """Candidates in order of first appearance, each (ip, port, proto) once."""
    if isinstance(data, str) and data.isascii():
        data = data.encode()
    hint = _proto(hint) if hint else None
    if not lab and isinstance(data, bytes) and _plain(data):
        if _c_scan is not None:  # already deduplicated, in order
            return _c_scan(data, _CODES.index(hint), Candidate, _CODES, _CONFIDENCES)  # type: ignore[no-any-return]
        return _first_of_each(_fast(data, hint))
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    head = text.lstrip()[:1]
    found: Iterator[Candidate]
    if head in ("[", "{"):
        try:
            # Walked here, not lazily: nesting deeper than Python's stack (a hostile
            # page) raises now, and the page is then read as text instead.
            found = iter(list(_json_walk(msgspec.json.decode(text), hint, lab)))
        except (msgspec.DecodeError, RecursionError):
            found = _text(text, hint, lab)
    elif "<" in text and _TAG.search(text):
        text = _unscript(text) if "<script" in text.lower() else text
        # A tag ends a line, so text in two elements ("version 1.2.3.4" | "8080", an
        # address and a latency) is never read as one column pair: tables join their
        # cells themselves (_html), grids of elements theirs (_nodes).
        flat = _TAG.sub("\n", text)
        first = _first_of_each(_chain(_html(text, hint, lab), _text(flat, hint, lab)))
        # Split elements last, and only for addresses nothing above found (the same
        # address with another protocol guess would be a duplicate).
        seen = {(c.ip, c.port) for c in first}
        return first + [c for c in _first_of_each(_nodes(text, hint, lab)) if c[:2] not in seen]
    else:
        found = _text(text, hint, lab)
    return _first_of_each(found)


def _first_of_each(found: Iterator[Candidate]) -> list[Candidate]:
    seen: dict[tuple[str, int, str | None], Candidate] = {}
    for c in found:
        key = (c.ip, c.port, c.proto)
        if key not in seen:
            seen[key] = c
    return list(seen.values())


def _chain(*parts: Iterator[Candidate]) -> Iterator[Candidate]:
    for part in parts:
        yield from part
