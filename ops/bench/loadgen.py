"""The load generator of ``ppf bench serve --workers``: requests through a proxy, as many
as asked, for as long as asked, or at a rate, and what became of each.

Three kinds of load: ``http`` (plain GETs, the proxy sent absolute URIs), ``https``
(GETs of a TLS site through CONNECT tunnels, as a browser's), ``tunnel`` (long-lived
CONNECT tunnels, each carrying request after request of plain HTTP inside, as a
scraper's session). Keep-alive on reuses connections (and tunnels) between requests;
off opens one a request. With a rate the requests start on a schedule, each timed from
when it was due (a slow answer does not hide the requests queued behind it), at most
``concurrency`` in flight; without one, ``concurrency`` at a time as fast as they come.

Each request ends one way: ``answered`` (a status below 500), ``server_errors`` (5xx:
the proxy or the site said it failed) or ``lost`` (no answer within ``timeout_s``, or
the connection failed). Latencies go into a histogram of fixed size (``Histogram``:
log-spaced buckets from 0.1 ms to two minutes), whatever the count.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import resource
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

__all__ = ["Histogram", "Load", "Result", "generate"]

_EDGES_MS = tuple(0.1 * 1.25**i for i in range(64))  # 0.1 ms to ~160 s, 25 % apart


@dataclass
class Histogram:
    """Latencies in fixed buckets: ``counts[i]`` below ``_EDGES_MS[i]`` (the last: above all)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(_EDGES_MS) + 1))
    most_ms: float = 0.0

    def add(self, ms: float) -> None:
        self.counts[bisect.bisect_left(_EDGES_MS, ms)] += 1
        self.most_ms = max(self.most_ms, ms)

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.most_ms = max(self.most_ms, other.most_ms)

    def quantile_ms(self, q: float) -> float:
        """The upper edge of the bucket holding the ``q`` quantile (within 25 %; never
        past the largest latency seen)."""
        total = sum(self.counts)
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if total and seen >= q * total:
                edge = _EDGES_MS[i] if i < len(_EDGES_MS) else self.most_ms
                return round(min(edge, self.most_ms), 2)
        return 0.0

    def figures(self) -> dict[str, float]:
        return {f"p{k}_ms": self.quantile_ms(q) for k, q in
                (("50", 0.5), ("90", 0.9), ("99", 0.99), ("999", 0.999))} | {
                "max_ms": round(self.most_ms, 2)}  # fmt: skip


@dataclass
class Load:
    mode: str  # http, https, tunnel
    keepalive: bool = True
    requests: int | None = None  # a count, or
    duration_s: float | None = None  # for as long
    rate: float | None = None  # requests a second; None: as fast as ``concurrency`` goes
    concurrency: int = 20
    timeout_s: float = 30.0


@dataclass
class Result:
    sent: int = 0
    answered: int = 0
    ok: int = 0  # of the answered, a 2xx
    server_errors: int = 0
    lost: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the generator's own
    latency: Histogram = field(default_factory=Histogram)

    def merge(self, other: Result) -> None:
        """``other``'s requests counted here too (loads run side by side)."""
        for name in ("sent", "answered", "ok", "server_errors", "lost", "cpu_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wall_s = max(self.wall_s, other.wall_s)
        self.latency.merge(other.latency)

    def figures(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "ok": self.ok,
            "server_errors": self.server_errors,
            "lost": self.lost,
            "req_per_s": round(self.sent / self.wall_s, 1) if self.wall_s else 0.0,
            "generator_cpu_us_per_request": round(self.cpu_s / max(self.sent, 1) * 1e6, 1),
            **self.latency.figures(),
        }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def generate(
    load: Load, proxy: str, plain_url: str, secure_url: str, tls: ssl.SSLContext
) -> Result:
    """``load`` through ``proxy`` (``http://NAME:TOKEN@HOST:PORT``) to ``plain_url`` (http,
    tunnel) or ``secure_url`` (https), whose certificate ``tls`` trusts."""
    result = Result()
    connector = aiohttp.TCPConnector(limit=load.concurrency, force_close=not load.keepalive)
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        tunnels = _Tunnels(proxy, plain_url, load.keepalive)
        url = secure_url if load.mode == "https" else plain_url

        async def by_client() -> int:
            async with http.get(url, proxy=proxy, ssl=tls if load.mode == "https" else True) as r:
                await r.read()
                return r.status

        one = tunnels.request if load.mode == "tunnel" else by_client
        try:
            await _paced(load, one, result)
        finally:
            tunnels.close()
    return result


async def _paced(load: Load, one: Callable[[], Awaitable[int]], result: Result) -> None:
    slots = asyncio.Semaphore(load.concurrency)
    running: set[asyncio.Task[None]] = set()
    cpu, started = _cpu_s(), time.perf_counter()

    async def timed(due: float) -> None:
        try:
            async with asyncio.timeout(load.timeout_s):
                status = await one()
        except (aiohttp.ClientError, OSError, TimeoutError, asyncio.IncompleteReadError,
                ValueError, IndexError):  # fmt: skip
            result.lost += 1
            return
        finally:
            slots.release()
        result.latency.add((time.perf_counter() - due) * 1000)
        if status >= 500:
            result.server_errors += 1
        else:
            result.answered += 1
            result.ok += 200 <= status < 300

    while load.requests is None or result.sent < load.requests:
        now = time.perf_counter()
        if load.duration_s is not None and now - started >= load.duration_s:
            break
        due = now
        if load.rate:
            due = started + result.sent / load.rate
            if due > now:
                await asyncio.sleep(due - now)
        await slots.acquire()
        task = asyncio.ensure_future(timed(due))
        running.add(task)
        task.add_done_callback(running.discard)
        result.sent += 1
    while running:
        await asyncio.gather(*list(running))
    result.wall_s = time.perf_counter() - started
    result.cpu_s = _cpu_s() - cpu


class _Tunnels:
    """CONNECT tunnels to the plain site, each carrying one request at a time; kept for
    the next request with keep-alive, else one a request."""

    def __init__(self, proxy: str, url: str, keepalive: bool) -> None:
        parts, site = urlsplit(proxy), urlsplit(url)
        self.proxy = (parts.hostname or "", parts.port or 80)
        login = base64.b64encode(f"{parts.username}:{parts.password}".encode()).decode()
        target = f"{site.hostname}:{site.port}"
        self.connect = (
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            f"Proxy-Authorization: Basic {login}\r\n\r\n"
        ).encode()
        closing = "" if keepalive else "Connection: close\r\n"
        self.get = f"GET {site.path or '/'} HTTP/1.1\r\nHost: {target}\r\n{closing}\r\n".encode()
        self.keepalive = keepalive
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self) -> int:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(*self.proxy)
            writer.write(self.connect)
            head = await reader.readuntil(b"\r\n\r\n")
            if head.split(b" ", 2)[1] != b"200":
                writer.close()
                return int(head.split(b" ", 2)[1])
        try:
            writer.write(self.get)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        if self.keepalive:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return int(head.split(b" ", 2)[1])

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
