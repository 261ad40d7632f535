"""The one address rule: which addresses can be on the public internet, and so can be a
proxy, an exit, a source's or a fetch target's host, a judge, or a destination of the
rotating endpoint. Pure and fast: this runs on every report.

The rule is written out here, never taken from Python's ``ipaddress.is_global``, whose
answers change between patch releases (3.11.7 calls 192.0.0.0/24 global, 3.11.10 does
not): the fold applies it, and the same log must fold to the same digest on every
release. Two revisions exist, chosen by ``Settings.address_rule`` in the fold:

- **0**, what the fold applied before the setting: IPv4 by ``_NOT_PUBLIC_V4``; IPv6 as
  Python 3.11.7's ``is_global`` answered (``_PY3117_*``, written out), which accepted
  multicast and IPv6 forms that carry a private IPv4.
- **1** (``ADDRESS_RULE``, what every other caller uses): the IANA special-purpose
  registries for IPv4 and IPv6, multicast refused, only the global unicast space
  2000::/3 for IPv6, and every IPv6 form that embeds an IPv4 address (mapped,
  translated, compatible, NAT64, 6to4, Teredo) judged by that IPv4.
"""

from __future__ import annotations

import ipaddress
from socket import AF_INET, inet_pton

__all__ = [
    "ADDRESS_RULE",
    "INTERNAL_SUFFIXES",
    "address_public",
    "embedded_ipv4",
    "internal_name",
    "parse_ipv4",
    "proxy_address_ok",
    "public",
]

ADDRESS_RULE = 1

# Every IPv4 range that cannot hold a public host (the IANA IPv4 special-purpose
# registry, RFC 6890 and after, with multicast): this-network, private, shared (CGNAT),
# loopback, link-local, IETF protocol assignments (its anycast service addresses are no
# proxies either), documentation, 6to4 relay anycast, benchmarking, multicast,
# reserved and broadcast.
_NOT_PUBLIC_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
# A lab (``--lab``) runs real proxies on loopback and private networks.
_LAB_V4 = ("10.0.0.0/8", "127.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")

# The IANA IPv6 special-purpose registry inside 2000::/3 whose blocks are not globally
# reachable: IETF protocol assignments (2001::/23, less the global service blocks
# below), benchmarking, documentation (two), the deprecated ORCHID.
_NOT_PUBLIC_V6 = ("2001::/23", "2001:2::/48", "2001:db8::/32", "2001:10::/28", "3fff::/20")
_GLOBAL_IN_2001 = (
    "2001:1::1/128",
    "2001:1::2/128",
    "2001:1::3/128",
    "2001:3::/32",
    "2001:4:112::/48",
    "2001:20::/28",
    "2001:30::/28",
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_LAB_V6 = (ipaddress.IPv6Network("::1/128"), ipaddress.IPv6Network("fc00::/7"))
# IPv6 forms that carry an IPv4 address and reach it.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_SIXTOFOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")

# Rule 0's IPv6 answers: Python 3.11.7's ``is_private`` lists (an IPv4-mapped address is
# judged by the IPv4 list), ``is_global`` being their negation.
_PY3117_PRIVATE_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/29",
    "192.0.0.170/31",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
    "255.255.255.255/32",
)
_PY3117_PRIVATE_V6 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::1/128",
        "::/128",
        "100::/64",
        "2001::/23",
        "2001:2::/48",
        "2001:db8::/32",
        "2001:10::/28",
        "fc00::/7",
        "fe80::/10",
    )
)
# 3.11.7 also called 100.64.0.0/10 not global (its only IPv4 difference from private).
_PY3117_NOT_GLOBAL_V4 = (*_PY3117_PRIVATE_V4, "100.64.0.0/10")

# Names no public resolver answers, or that a resolver inside a network answers with
# its own hosts: special-use (RFC 6761, 6762, 7686, 8375), the names cloud platforms and
# Kubernetes give inside, and the suffixes companies use for their own networks.
INTERNAL_SUFFIXES = (
    ".localhost",
    ".local",
    ".localdomain",
    ".internal",
    ".intranet",
    ".private",
    ".corp",
    ".lan",
    ".home",
    ".home.arpa",
    ".test",
    ".invalid",
    ".example",
    ".onion.internal",
    ".svc",
    ".cluster.local",
    ".svc.cluster.local",
    ".consul",
    ".ec2.internal",
    ".compute.internal",
    ".in-addr.arpa",
    ".ip6.arpa",
)


def _by_first_octet(cidrs: tuple[str, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For each first octet, the (network >> shift, shift) pairs that may contain it."""
    table: list[list[tuple[int, int]]] = [[] for _ in range(256)]
    for cidr in cidrs:
        net = ipaddress.IPv4Network(cidr)
        shift = 32 - net.prefixlen
        first = int(net.network_address) >> 24
        last = int(net.broadcast_address) >> 24
        for octet in range(first, last + 1):
            table[octet].append((int(net.network_address) >> shift, shift))
    return tuple(tuple(entry) for entry in table)


_BLOCKED = _by_first_octet(_NOT_PUBLIC_V4)
_LAB = _by_first_octet(_LAB_V4)
_PY3117_BLOCKED = _by_first_octet(_PY3117_NOT_GLOBAL_V4)
_PY3117_PRIVATE = _by_first_octet(_PY3117_PRIVATE_V4)
_V6_BLOCKED = tuple(ipaddress.IPv6Network(n) for n in _NOT_PUBLIC_V6)
_V6_GLOBAL = tuple(ipaddress.IPv6Network(n) for n in _GLOBAL_IN_2001)


def _within(table: tuple[tuple[tuple[int, int], ...], ...], value: int) -> bool:
    return any((value >> shift) == net for net, shift in table[value >> 24])


def parse_ipv4(text: str) -> int | None:
    """Strict dotted quad (inet_pton: four decimal octets, no leading zeros)."""
    try:
        return int.from_bytes(inet_pton(AF_INET, text), "big")
    except (OSError, ValueError):
        return None


def embedded_ipv4(
    address: ipaddress.IPv6Address, rule: int = ADDRESS_RULE
) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one carries and reaches (mapped, translated, the old
    compatible form, NAT64, 6to4; Teredo's server and client), or (). Rule 0 knew
    fewer forms (``_rule0_embedded``)."""
    if rule == 0:
        return _rule0_embedded(address)
    value = int(address)
    low = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address in _MAPPED or address in _TRANSLATED or address in _NAT64:
        return (low,)
    if address in _COMPATIBLE and value > 1:
        return (low,)
    if address in _SIXTOFOUR:
        return (ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF),)
    if address in _TEREDO:
        server = ipaddress.IPv4Address((value >> 64) & 0xFFFFFFFF)
        return (server, ipaddress.IPv4Address(~value & 0xFFFFFFFF))
    return ()


def _rule0_embedded(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """Rule 0's forms, first match only: mapped, 6to4, Teredo's client, NAT64 (both
    prefixes), compatible."""
    value = int(address)
    low = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if address in _MAPPED:
        return (low,)
    if address in _SIXTOFOUR:
        return (ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF),)
    if address in _TEREDO:
        return (ipaddress.IPv4Address(~value & 0xFFFFFFFF),)
    if address in _NAT64 or address in _NAT64_LOCAL or (address in _COMPATIBLE and value > 1):
        return (low,)
    return ()


def _v4_public(value: int, lab: bool) -> bool:
    if not _BLOCKED[value >> 24] or not _within(_BLOCKED, value):
        return True
    return lab and _within(_LAB, value)


def _v6_public(address: ipaddress.IPv6Address, lab: bool) -> bool:
    inner = embedded_ipv4(address)
    if inner:
        return all(_v4_public(int(v4), lab) for v4 in inner)
    if lab and any(address in net for net in _LAB_V6):
        return True
    if address not in _GLOBAL_UNICAST:
        return False  # reserved by the IETF, loopback, ULA, link-local, multicast, ...
    if any(address in net for net in _V6_BLOCKED):
        return any(address in net for net in _V6_GLOBAL)
    return True


def public(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    *,
    lab: bool = False,
    rule: int = ADDRESS_RULE,
) -> bool:
    """Whether ``address`` can be a host on the public internet under ``rule``; ``lab``
    also admits loopback and private networks."""
    if rule == 0:  # as 3.11.7's ``is_global`` answered (the URL rule before the setting)
        if isinstance(address, ipaddress.IPv6Address):
            return _py3117_v6_global(address) or lab
        value = int(address)
        py3117_global = not (_PY3117_BLOCKED[value >> 24] and _within(_PY3117_BLOCKED, value))
        return py3117_global or (lab and _within(_LAB, value))
    if isinstance(address, ipaddress.IPv4Address):
        return _v4_public(int(address), lab)
    return _v6_public(address, lab)


def _py3117_v6_global(address: ipaddress.IPv6Address) -> bool:
    value = int(address)
    if value >> 32 == 0xFFFF:  # what 3.11.7 called ``ipv4_mapped``
        v4 = value & 0xFFFFFFFF
        return not (_PY3117_PRIVATE[v4 >> 24] and _within(_PY3117_PRIVATE, v4))
    return not any(address in net for net in _PY3117_PRIVATE_V6)


def address_public(text: str, *, lab: bool = False) -> bool:
    """``public`` for an address written as text (a resolver's answer, a URL's host);
    False for what is no address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return public(address, lab=lab)


def internal_name(host: str) -> bool:
    """``localhost``, a single label (``intranet``), or a name under an internal suffix:
    never public, whatever a resolver would say."""
    name = host.rstrip(".").lower()
    return "." not in name or name.endswith(INTERNAL_SUFFIXES)


def _canonical_v6(address: ipaddress.IPv6Address) -> str:
    """How 3.11.7 printed an IPv6 address (later releases print the mapped form with a
    dotted IPv4): one proxy has one key whatever the release."""
    value = int(address)
    if value >> 32 == 0xFFFF:
        return f"::ffff:{(value >> 16) & 0xFFFF:x}:{value & 0xFFFF:x}"
    return str(address)


def proxy_address_ok(ip: str, port: int, *, lab: bool = False, rule: int = ADDRESS_RULE) -> bool:
    """True when ``ip:port`` can be an open proxy under ``rule``; ``lab`` also admits
    private and loopback. From rule 1 an IPv6 address that only spells an IPv4 one
    (mapped, translated, compatible) is no proxy's key: the proxy is its IPv4."""
    if not 0 < port <= 65535:
        return False
    value = parse_ipv4(ip)
    if value is not None:  # the same table under both rules
        return _v4_public(value, lab)
    if ":" not in ip:
        return False
    try:
        address = ipaddress.IPv6Address(ip)
    except ValueError:
        return False
    if _canonical_v6(address) != ip:  # one canonical spelling, so one proxy has one key
        return False
    if rule == 0:  # as 3.11.7's ``is_global`` answered, and a lab took every address
        return _py3117_v6_global(address) or lab
    if address in _MAPPED or address in _TRANSLATED or address in _COMPATIBLE:
        return False
    return _v6_public(address, lab)
