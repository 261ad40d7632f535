"""The server name a TLS ClientHello carries (SNI, RFC 6066), read from a tunnel's first
bytes: for a tunnel to an address (a SOCKS5 client that resolved the name itself, a
CONNECT to an IP), the name is the only word of which site it goes to. Nothing in the
dependencies reads a ClientHello (``ssl`` reads only its own), so the few fields before
the extensions are stepped over here, each length checked against what came.
"""

from __future__ import annotations

__all__ = ["MAX_HELLO", "hello_size", "server_name"]

MAX_HELLO = 16_384 + 5  # one TLS record: a ClientHello longer than that is not waited for
_HANDSHAKE, _CLIENT_HELLO, _SERVER_NAME, _HOST_NAME = 0x16, 0x01, 0x0000, 0x00


def hello_size(data: bytes) -> int | None:
    """How many bytes the TLS record ``data`` begins carries, header included (None: not
    a TLS handshake record, or not yet its header)."""
    if len(data) < 5 or data[0] != _HANDSHAKE:
        return None
    return min(5 + int.from_bytes(data[3:5], "big"), MAX_HELLO)


def server_name(data: bytes) -> str:
    """The host name of a ClientHello's server_name extension, lower case; "" when
    ``data`` is not a whole ClientHello record or names no host."""
    size = hello_size(data)
    if size is None or len(data) < size or data[5] != _CLIENT_HELLO:
        return ""
    body, at = data[:size], 5 + 4 + 2 + 32  # record, handshake header, version, random
    try:
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at : at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
        end = min(at + 2 + int.from_bytes(body[at : at + 2], "big"), len(body))
        at += 2
        while at + 4 <= end:
            kind = int.from_bytes(body[at : at + 2], "big")
            length = int.from_bytes(body[at + 2 : at + 4], "big")
            at += 4
            if kind == _SERVER_NAME:
                return _host_name(body[at : at + length])
            at += length
    except IndexError:
        return ""
    return ""


def _host_name(extension: bytes) -> str:
    """The first host_name of a server_name extension's list."""
    at, end = 2, min(2 + int.from_bytes(extension[:2], "big"), len(extension))
    while at + 3 <= end:
        kind, length = extension[at], int.from_bytes(extension[at + 1 : at + 3], "big")
        name = extension[at + 3 : at + 3 + length]
        if kind == _HOST_NAME and len(name) == length:
            try:
                return name.decode("ascii").lower().rstrip(".")
            except UnicodeDecodeError:
                return ""
        at += 3 + length
    return ""
