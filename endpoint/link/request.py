"""One request as the connection room reads it (plain HTTP, CONNECT or SOCKS5), handed
down through the router to the link that carries it, and what became of it so far."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from events.sites import SiteRule

__all__ = ["TUNNEL", "Request"]


@dataclass(slots=True)
class Request:
    """One client request: plain HTTP, whole (its absolute URI, header lines and body),
    or a tunnel (``TUNNEL``: CONNECT or SOCKS5) to ``host:port``; and what became of it
    so far. The connection room fills in what the client said, the router the rest."""

    method: bytes  # TUNNEL for CONNECT and SOCKS5
    target: bytes  # the absolute URI the client sent (a tunnel: host:port)
    host: str = ""
    port: int = 0
    lines: bytes = b""  # its header lines but the hop-by-hop ones, each ending in CRLF
    body: bytes = b""
    keep_alive: bool = False
    authorization: bytes = b""  # its Proxy-Authorization, as it came
    http11: bool = True  # an HTTP/1.0 client gets no chunked answer and no 1xx
    read_at: float = field(default_factory=time.perf_counter)
    origin: bytes = b"/"  # the target in origin form, for a SOCKS tunnel to the site
    tried: frozenset[tuple[str, int]] = frozenset()
    failures: int = 0
    fresh_only: bool = False  # a stale idle link was met: the next try opens a new one
    # The last proxy's whole answer, held back and read as a block: the client's when no
    # other proxy is left to try (router/forwarding.py).
    last: bytes = b""
    site: str = ""  # the site it goes to (events/sites.py)
    named: bool = False  # a tunnel to an address whose site its ClientHello named (SNI)
    rule: SiteRule | None = None  # how that site's answers read

    def head(self, forward: bool) -> bytes:
        """To an HTTP proxy the absolute URI; through a SOCKS tunnel the origin form."""
        target = self.target if forward else self.origin
        return b"%s %s HTTP/1.1\r\n%s\r\n" % (self.method, target, self.lines)


TUNNEL = b"CONNECT"
