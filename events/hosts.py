"""A URL's host judged by what it reaches, not by how it is spelled.

The address rules (events/validate.py ``url_problem``) refuse sources on hosts that
cannot be public. A host can pass them by its spelling alone: percent-encoded
(``%31%32%37.0.0.1``), in full-width digits an IDNA resolver folds to ASCII, an IPv6
literal that carries a private IPv4 inside it (NAT64 ``64:ff9b::7f00:1``, 6to4
``2002:7f00:1::``, mapped, compatible, Teredo: ``events.address.embedded_ipv4``), or
a name whose wildcard DNS answers with the address its labels spell
(``127.0.0.1.nip.io``, ``10-0-0-1.sslip.io``, ``7f000001.nip.io``), or a name that
always answers loopback (``lvh.me``). These rules judge a copy of the host normalised
for that purpose only: ``normalize_url`` and ``url_id`` keep the URL as it was given.
Pure: nothing here resolves a name.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote

__all__ = [
    "ALWAYS_LOOPBACK",
    "WILDCARD_DNS",
    "rules_host",
    "spelled_address",
]

# Public names that answer every query with loopback (used for local development).
ALWAYS_LOOPBACK = (
    "localtest.me",
    "lvh.me",
    "vcap.me",
    "fuf.me",
    "lacolhost.com",
    "localhost.direct",
)
# Wildcard DNS services: a name under them resolves to the address its labels spell,
# also in hex (``7f000001.nip.io``) and, for IPv6, with dashes for colons.
WILDCARD_DNS = ("nip.io", "sslip.io", "xip.io", "traefik.me", "nip.lol", "localip.dev")

_QUAD = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_DOTTED = re.compile(rf"(?:^|\.)({_QUAD}(?:\.{_QUAD}){{3}})(?:\.|$)")
_DASHED = re.compile(rf"(?:^|[.-])({_QUAD}(?:-{_QUAD}){{3}})(?:\.|$)")
_HEX = re.compile(r"(?:^|[.-])([0-9a-f]{8})\.")


def rules_host(hostname: str) -> tuple[str, str]:
    """(host, "") normalised for the address rules (percent-decoded, IDNA to ASCII,
    lower case, no trailing dot), or ("", why) when no resolver could take it."""
    host = unquote(hostname)
    if any(c.isspace() or not c.isprintable() for c in host):
        return "", "the host holds a space or a control character"
    host = host.strip("[]").rstrip(".").lower()
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return "", "the host is not a valid international name"
    return host, ""


def spelled_address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a name's labels spell for wildcard DNS (a dotted or dashed quad
    anywhere; hex or dashed IPv6 under a named service), loopback for the names that
    always answer it; None when it spells none."""
    if any(name == d or name.endswith("." + d) for d in ALWAYS_LOOPBACK):
        return ipaddress.IPv4Address("127.0.0.1")
    for pattern in (_DOTTED, _DASHED):
        found = pattern.search(name)
        if found:
            return ipaddress.IPv4Address(found.group(1).replace("-", "."))
    service = next((d for d in WILDCARD_DNS if name.endswith("." + d)), None)
    if service is None:
        return None
    found = _HEX.search(name)
    if found:
        return ipaddress.IPv4Address(int(found.group(1), 16))
    label = name[: -len(service) - 1].rsplit(".", 1)[-1]
    if "--" in label or label.count("-") >= 2:
        try:
            return ipaddress.IPv6Address(label.replace("-", ":"))
        except ValueError:
            return None
    return None
