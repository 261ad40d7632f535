"""Fetching proxy lists: through an upstream (Tor or any SOCKS/HTTP proxy) or direct.

Bounded in time and size, conditional when the source supports it (ETag and
Last-Modified), and guarded: a URL whose host resolves to a private, loopback or
link-local address is refused unless the lab flag allows it, so a list cannot point
the fleet at its own networks.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp_socks import ProxyConnector

__all__ = ["FetchResult", "Fetcher"]

MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FetchResult:
    ok: bool
    status: int = 0
    body: bytes = b""
    content_hash: str = ""
    fetch_ms: int = 0
    error: str = ""
    etag: str = ""
    last_modified: str = ""
    not_modified: bool = False


class Fetcher:
    """One aiohttp session (with the upstream's connector) for many fetches."""

    def __init__(
        self,
        *,
        upstream: str | None = None,
        lab: bool = False,
        timeout_s: float = 30.0,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.upstream = upstream
        self.lab = lab
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Fetcher:
        connector = ProxyConnector.from_url(self.upstream) if self.upstream else None
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self.timeout, headers={"User-Agent": "ppf/1"}
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _guard(self, url: str) -> str | None:
        """An error when the URL may not be fetched, else None."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"not an http(s) URL: {url!r}"
        if self.lab or self.upstream:
            return None  # through an upstream, the upstream resolves (Tor: remotely)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname, parts.port or 80, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            return f"cannot resolve {parts.hostname}: {exc}"
        for info in infos:
            addr = ipaddress.ip_address(info[4][0])
            if not addr.is_global:
                return f"refused: {parts.hostname} resolves to non-public {addr}"
        return None

    async def fetch(self, url: str, *, etag: str = "", last_modified: str = "") -> FetchResult:
        assert self._session is not None, "use `async with Fetcher(...)`"
        refused = await self._guard(url)
        if refused:
            return FetchResult(ok=False, error=refused)
        headers = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        started = time.perf_counter()
        try:
            async with self._session.get(url, headers=headers, allow_redirects=True) as r:
                ms = int((time.perf_counter() - started) * 1000)
                if r.status == 304:
                    return FetchResult(
                        ok=True,
                        status=304,
                        fetch_ms=ms,
                        not_modified=True,
                        etag=etag,
                        last_modified=last_modified,
                    )
                if r.status >= 400:
                    return FetchResult(
                        ok=False, status=r.status, fetch_ms=ms, error=f"HTTP {r.status}"
                    )
                body = await r.content.read(self.max_bytes + 1)
                if len(body) > self.max_bytes:
                    return FetchResult(
                        ok=False,
                        status=r.status,
                        fetch_ms=ms,
                        error=f"larger than {self.max_bytes} bytes",
                    )
                return FetchResult(
                    ok=True,
                    status=r.status,
                    body=body,
                    content_hash=hashlib.sha256(body).hexdigest(),
                    fetch_ms=int((time.perf_counter() - started) * 1000),
                    etag=r.headers.get("ETag", ""),
                    last_modified=r.headers.get("Last-Modified", ""),
                )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ms = int((time.perf_counter() - started) * 1000)
            return FetchResult(ok=False, fetch_ms=ms, error=f"{type(exc).__name__}: {exc}"[:200])
