"""Which addresses can be public proxies. Pure and fast: this runs on every report.

Shared by the reducers (admission to the pool) and the agents' extractor (candidates).
"""

from __future__ import annotations

import ipaddress
from socket import AF_INET, inet_pton

__all__ = ["parse_ipv4", "proxy_address_ok"]

# Every IPv4 range that cannot hold a public proxy (RFC 6890): this-network, private,
# CGNAT, loopback, link-local, IETF, documentation, benchmarking, 6to4 relay,
# multicast and reserved.
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


def _within(table: tuple[tuple[tuple[int, int], ...], ...], value: int) -> bool:
    return any((value >> shift) == net for net, shift in table[value >> 24])


def parse_ipv4(text: str) -> int | None:
    """Strict dotted quad (inet_pton: four decimal octets, no leading zeros)."""
    try:
        return int.from_bytes(inet_pton(AF_INET, text), "big")
    except (OSError, ValueError):
        return None


def proxy_address_ok(ip: str, port: int, *, lab: bool = False) -> bool:
    """True when ``ip:port`` can be an open proxy; ``lab`` also admits private and loopback."""
    if not 0 < port <= 65535:
        return False
    value = parse_ipv4(ip)
    if value is not None:
        if not _BLOCKED[value >> 24] or not _within(_BLOCKED, value):
            return True
        return lab and _within(_LAB, value)
    if ":" not in ip:
        return False
    try:
        addr = ipaddress.IPv6Address(ip)
    except ValueError:
        return False
    if str(addr) != ip:  # one canonical spelling, so one proxy has one key
        return False
    return addr.is_global or (lab and (addr.is_loopback or addr.is_private))
