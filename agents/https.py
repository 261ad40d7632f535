"""Whether a proxy carries HTTPS: one tunnel through it (CONNECT for HTTP proxies, the
SOCKS one otherwise) to a real HTTPS endpoint with a known 2xx answer."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from agents.tunnel import Tls, connect

__all__ = ["HTTPS_TARGETS", "tunnels_https"]


# Real HTTPS endpoints with a small known answer (a 2xx, no body to speak of): a proxy
# that passes the judge is tried once through a tunnel to one of them.
HTTPS_TARGETS = (
    "https://www.gstatic.com/generate_204",
    "https://cp.cloudflare.com/generate_204",
    "https://connectivitycheck.gstatic.com/generate_204",
)


async def tunnels_https(ip: str, port: int, proto: str, url: str, timeout: float) -> bool:
    """Whether the proxy carries a TLS session to ``url`` and its answer back: a CONNECT
    tunnel for HTTP proxies, the SOCKS one otherwise. The certificate is not judged here
    (interception is the TLS judge's matter); a 2xx status line through TLS is the answer.
    """
    parts = urlsplit(url)
    host, target_port = parts.hostname or "", parts.port or 443
    writer = None
    try:
        async with asyncio.timeout(timeout):
            via = "https" if proto == "http" else proto  # an HTTP proxy tunnels by CONNECT
            reader, writer = await connect(ip, port, via, host, target_port, timeout)
            tls = Tls(reader, writer, host)
            await tls.handshake()
            tls.write(
                f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await tls.drain()
            head = await tls.read(4096)
    except Exception:  # python-socks, TLS and socket errors alike: not carried
        return False
    finally:
        if writer is not None:
            writer.close()
    status = head.split(b" ", 2)
    return len(status) >= 2 and status[0].startswith(b"HTTP/") and status[1][:1] == b"2"
