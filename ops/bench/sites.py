"""A consumer of the rotating endpoint that names no site, and what it got from each:
the real page (through a proxy's exit) or not; with the box's truth, how well the pool
says who gets through (``works_on``). The box's test (tests/test_sites_box.py) measures
with it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable

import aiohttp

from ops.lab.sitebox import real_page_of

__all__ = ["SCHEMES", "Consumer", "precision_recall"]

SCHEMES = ("http", "https")


def precision_recall(said: set[str], truth: set[str]) -> tuple[float, float]:
    """Of the proxies ``said`` to get through, the share that do; of those that do
    (``truth``), the share said (1.0 where there is nothing to find)."""
    right = len(said & truth)
    return (right / len(said) if said else 1.0, right / len(truth) if truth else 1.0)


class Consumer:
    """Requests through ``proxy`` (the endpoint, its login in the URL), each on a new
    connection (each a new pick), ``concurrency`` at once: per (site, scheme), how many
    got the site's real page and what the others got. A real page asked from anywhere
    but one of ``exits`` (a direct visit) is kept in ``elsewhere``."""

    def __init__(self, proxy: str, exits: set[str], concurrency: int = 10) -> None:
        self.proxy, self.exits, self.concurrency = proxy, exits, concurrency
        self.tally: dict[tuple[str, str], tuple[int, list[str]]] = {}
        self.elsewhere: list[str] = []
        self._tls = ssl.create_default_context()
        self._tls.check_hostname, self._tls.verify_mode = False, ssl.CERT_NONE

    def reset(self) -> None:
        self.tally.clear()

    async def send(self, sites: Iterable[str], each: int) -> None:
        """``each`` requests to every site over each scheme, interleaved."""
        work = iter((site, scheme, i) for i in range(each) for site in sites for scheme in SCHEMES)
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(force_close=True, limit=self.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

            async def worker() -> None:
                for site, scheme, i in work:
                    self._count(site, scheme, await self._one(http, site, scheme, i))

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    async def _one(self, http: aiohttp.ClientSession, site: str, scheme: str, i: int) -> str:
        """ "" for the real page, else what came instead."""
        url = f"{scheme}://{site}/page/{i}"
        try:
            async with http.get(url, proxy=self.proxy, ssl=self._tls) as r:
                body = await r.read()
        except aiohttp.ClientHttpProxyError as exc:
            return f"endpoint {exc.status} {exc.message[:60]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return repr(exc)[:100]
        seen = real_page_of(site, body)
        if r.status != 200 or not seen:
            return f"{r.status} {body[:60]!r}"
        if seen not in self.exits:
            self.elsewhere.append(f"{url} from {seen}")
        return ""

    def _count(self, site: str, scheme: str, wrong: str) -> None:
        got, wrongs = self.tally.get((site, scheme), (0, []))
        if wrong:
            wrongs.append(wrong)
        self.tally[(site, scheme)] = (got + (not wrong), wrongs)
