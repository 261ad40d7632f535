"""Fetching proxy lists: through an upstream (Tor or any SOCKS/HTTP proxy) or direct.

Bounded in time and size, conditional when the source supports it (ETag and
Last-Modified), and guarded: a URL whose host resolves to a private, loopback or
link-local address is refused unless the lab flag allows it, so a list cannot point
the fleet at its own networks.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import ipaddress
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from aiohttp_socks import ProxyConnectionError, ProxyConnector, ProxyError, ProxyTimeoutError
from yarl import URL

from events.address import ADDRESS_RULE, address_public
from events.validate import host_can_be_public, legacy_ipv4

__all__ = ["FetchResult", "Fetcher", "refusal"]

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
    upstream_down: bool = False  # the upstream itself did not answer: not the source's fault


MAX_REDIRECTS = 5


class _PublicOnlyResolver(AbstractResolver):
    """Refuses, at connect time, a name that resolves to any non-public address.

    Checking at connect time, not before the request, is what stops DNS rebinding: a
    name that answered a public address to a pre-check and a private one to the
    connection is still refused."""

    def __init__(self, admitted: frozenset[str]) -> None:
        self._inner = ThreadedResolver()
        self._admitted = admitted

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for info in found:
            if not address_public(info["host"]) and info["host"] not in self._admitted:
                # (errno, text): aiohttp shows only the strerror of what a resolver raised
                why = f"refused: {host} resolves to non-public {info['host']}"
                raise OSError(errno.EACCES, why)
        return found

    async def close(self) -> None:
        await self._inner.close()


def refusal(
    url: str, *, lab: bool = False, upstream: bool = False, admitted: frozenset[str] = frozenset()
) -> str | None:
    """Why the URL may not be fetched, or None. Names are checked when they are resolved
    (``_PublicOnlyResolver``); addresses written in the URL, here, with an upstream too:
    it would connect to them for us. ``upstream``: names are resolved there, so what
    cannot be public is refused by its form."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {url!r}"
    if lab:
        return None
    host = parts.hostname
    try:
        ipaddress.ip_address(host)
    except ValueError:
        legacy = legacy_ipv4(host)  # the rule sources are held to (events/validate)
        if legacy is None:
            # A name: resolved by our resolver, which refuses private answers; an
            # upstream resolves it where we cannot look (never locally: that would
            # leak every source to local DNS, and .onion names do not resolve).
            if upstream and not host_can_be_public(host, rule=ADDRESS_RULE):
                return f"refused: {host} cannot be a public name"
            return None
        host = legacy
    if not address_public(host) and host not in admitted:
        return f"refused: {host} is not a public address"
    return None


class Fetcher:
    """One aiohttp session (with the upstream's connector) for many fetches.

    ``lab`` admits every address; ``admitted`` admits the ones it names (a lab page on
    one loopback address, say, without opening the others). ``forward``: an HTTP
    upstream is asked for an http:// URL itself (absolute form), not through a tunnel,
    so it sees the request and the answer (the rotating endpoint, which steers by them:
    ppf mcp)."""

    def __init__(
        self,
        *,
        upstream: str | None = None,
        lab: bool = False,
        timeout_s: float = 30.0,
        max_bytes: int = MAX_BYTES,
        admitted: frozenset[str] = frozenset(),
        forward: bool = False,
    ) -> None:
        self.upstream = upstream
        self._proxy = upstream if forward and upstream and upstream.startswith("http://") else None
        self.lab = lab
        self.admitted = admitted
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Fetcher:
        connector: aiohttp.BaseConnector | None
        if self._proxy:  # aiohttp's own proxying: the upstream resolves names
            connector = None
        elif self.upstream:  # the upstream resolves names (Tor: at the exit)
            connector = ProxyConnector.from_url(self.upstream)
        elif self.lab:
            connector = None
        else:
            connector = aiohttp.TCPConnector(resolver=_PublicOnlyResolver(self.admitted))
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self.timeout, headers={"User-Agent": "ppf/1"}
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _guard(self, url: str) -> str | None:
        return refusal(url, lab=self.lab, upstream=bool(self.upstream), admitted=self.admitted)

    async def fetch(self, url: str, *, etag: str = "", last_modified: str = "") -> FetchResult:
        """One list: redirects followed by hand (at most 5), each hop guarded."""
        assert self._session is not None, "use `async with Fetcher(...)`"
        headers = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        started = time.perf_counter()

        def elapsed() -> int:
            return int((time.perf_counter() - started) * 1000)

        try:
            # One bound for the whole fetch, redirects included (each request has its own).
            async with asyncio.timeout(self.timeout.total):
                return await self._follow(url, headers, elapsed, etag, last_modified)
        except (ProxyConnectionError, ProxyTimeoutError) as exc:
            # Not OSErrors: before, they escaped and failed the worker's whole batch.
            return FetchResult(
                ok=False,
                fetch_ms=elapsed(),
                error=f"upstream: {type(exc).__name__}: {exc}"[:200],
                upstream_down=True,
            )
        except (aiohttp.ClientError, TimeoutError, OSError, ProxyError) as exc:
            # ProxyError: the upstream answered, and could not reach the source.
            return FetchResult(
                ok=False, fetch_ms=elapsed(), error=f"{type(exc).__name__}: {exc}"[:200]
            )

    async def _follow(
        self,
        url: str,
        headers: dict[str, str],
        elapsed: Callable[[], int],
        etag: str,
        last_modified: str,
    ) -> FetchResult:
        assert self._session is not None
        for _ in range(MAX_REDIRECTS + 1):
            refused = self._guard(url)
            if refused:
                return FetchResult(ok=False, fetch_ms=elapsed(), error=refused)
            got = self._session.get(url, headers=headers, allow_redirects=False, proxy=self._proxy)
            async with got as r:
                if r.status in (301, 302, 303, 307, 308) and "Location" in r.headers:
                    url = str(r.url.join(URL(r.headers["Location"])))
                    continue
                return await self._result(r, elapsed, etag, last_modified)
        return FetchResult(
            ok=False, fetch_ms=elapsed(), error=f"more than {MAX_REDIRECTS} redirects"
        )

    async def _result(
        self,
        r: aiohttp.ClientResponse,
        elapsed: Callable[[], int],
        etag: str,
        last_modified: str,
    ) -> FetchResult:
        if r.status == 304:
            return FetchResult(
                ok=True,
                status=304,
                fetch_ms=elapsed(),
                not_modified=True,
                etag=etag,
                last_modified=last_modified,
            )
        if r.status >= 400:
            return FetchResult(
                ok=False, status=r.status, fetch_ms=elapsed(), error=f"HTTP {r.status}"
            )
        # Read to the end: `content.read(n)` answers with what has arrived, up to n,
        # which may be the first chunk of a long list.
        chunks: list[bytes] = []
        size = 0
        async for chunk in r.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > self.max_bytes:
                return FetchResult(
                    ok=False,
                    status=r.status,
                    fetch_ms=elapsed(),
                    error=f"larger than {self.max_bytes} bytes",
                )
            chunks.append(chunk)
        body = b"".join(chunks)
        return FetchResult(
            ok=True,
            status=r.status,
            body=body,
            content_hash=hashlib.sha256(body).hexdigest(),
            fetch_ms=elapsed(),
            etag=r.headers.get("ETag", ""),
            last_modified=r.headers.get("Last-Modified", ""),
        )
