"""What the endpoint itself says to a client: its short HTTP answers, and who the client is."""

from __future__ import annotations

__all__ = ["answer", "peer_address"]


def answer(status: int, text: str, extra: bytes = b"") -> bytes:
    """A short answer of the endpoint's own, closing the connection."""
    body = (text + "\n").encode()
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n%s\r\n%s"
        % (status, _REASONS.get(status, b"Error"), len(body), extra, body)
    )


_REASONS = {
    400: b"Bad Request",
    403: b"Forbidden",
    407: b"Proxy Authentication Required",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
}


def peer_address(peername: object) -> str:
    """The client's address, from a transport's ``peername``."""
    return str(peername[0]) if isinstance(peername, tuple) and peername else ""
