"""A consumer of the rotating endpoint that names no site, and what it got from each:
the real page (through a proxy's exit) or not; with the box's truth, how well the pool
says who gets through (``works_on``). ``ppf bench sites`` (``bench_sites``) and the
box's test (tests/test_sites_box.py) measure with it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ops.bench.options import Sites
from ops.bench.upbox import Refused, UpBeside, gateway_json, up_beside
from ops.lab.sitebox import SITES, other_site, real_page_of
from ops.lab.world import World

__all__ = [
    "PAGES",
    "SCHEMES",
    "Consumer",
    "SitesBox",
    "bench_sites",
    "precision_recall",
    "rates_of",
    "served",
    "sites_box",
]

SCHEMES = ("http", "https")


def precision_recall(said: set[str], truth: set[str]) -> tuple[float, float]:
    """Of the proxies ``said`` to get through, the share that do; of those that do
    (``truth``), the share said (1.0 where there is nothing to find)."""
    right = len(said & truth)
    return (right / len(said) if said else 1.0, right / len(truth) if truth else 1.0)


PAGES = 20  # pages of each site the consumer asks, again and again (a scraper's rounds)


class Consumer:
    """Requests through ``proxy`` (the endpoint, its login in the URL), each on a new
    connection (each a new pick), at most ``concurrency`` in flight: per (site, scheme),
    how many got the site's real page and what the others got. A real page asked from
    anywhere but one of ``exits`` (a direct visit) is kept in ``elsewhere``."""

    def __init__(self, proxy: str, exits: set[str], concurrency: int = 40) -> None:
        self.proxy, self.exits, self.concurrency = proxy, exits, concurrency
        self.tally: dict[tuple[str, str], tuple[int, list[str]]] = {}
        self.elsewhere: list[str] = []
        self._tls = ssl.create_default_context()
        self._tls.check_hostname, self._tls.verify_mode = False, ssl.CERT_NONE
        self._asked: dict[str, int] = {}  # each site's requests so far, across calls

    def reset(self) -> None:
        self.tally.clear()

    def share(self, site: str, schemes: Iterable[str] = SCHEMES) -> tuple[float, int]:
        """The share of ``site``'s requests over ``schemes`` that got its real page,
        and how many there were."""
        got = asked = 0
        for scheme in schemes:
            real, wrong = self.tally.get((site, scheme), (0, []))
            got, asked = got + real, asked + real + len(wrong)
        return (got / asked if asked else 0.0), asked

    async def send(self, rates: dict[str, float], seconds: float) -> None:
        """For ``seconds``, requests to each site of ``rates`` at its rate a second,
        HTTP and HTTPS in turn, each to one of the site's ``PAGES`` pages in turn; the
        requests still out when the time is up are waited for."""
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(force_close=True, limit=self.concurrency)
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            gate = asyncio.Semaphore(self.concurrency)

            async def one(site: str, scheme: str, page: int) -> None:
                try:
                    self._count(site, scheme, await self._one(http, site, scheme, page))
                finally:
                    gate.release()

            async def site_at(site: str, rate: float) -> None:
                sent: list[asyncio.Task[None]] = []
                while (due := began + len(sent) / rate) < began + seconds:
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    await gate.acquire()
                    n = self._asked[site] = self._asked.get(site, -1) + 1
                    scheme, page = SCHEMES[n % 2], (n // 2) % PAGES
                    sent.append(asyncio.create_task(one(site, scheme, page)))
                await asyncio.gather(*sent)

            await asyncio.gather(*(site_at(site, rate) for site, rate in rates.items()))

    async def visit(self, sites: list[str]) -> int:
        """One plain-HTTP request to each of ``sites``, ``concurrency`` at once: how many
        got a page (what a pool's consumers visit besides the sites measured)."""
        timeout = aiohttp.ClientTimeout(total=30)
        connector = aiohttp.TCPConnector(force_close=True, limit=self.concurrency)
        left = iter(sites)
        got = 0
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

            async def worker() -> None:
                nonlocal got
                for site in left:
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with http.get(f"http://{site}/", proxy=self.proxy) as r:
                            got += r.status == 200 and bool(await r.read())

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        return got

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
            return f"{r.status} {body[-48:]!r}"  # a box's block ends with its exit
        if seen not in self.exits:
            self.elsewhere.append(f"{url} from {seen}")
        return ""

    def _count(self, site: str, scheme: str, wrong: str) -> None:
        got, wrongs = self.tally.get((site, scheme), (0, []))
        if wrong:
            wrongs.append(wrong)
        self.tally[(site, scheme)] = (got + (not wrong), wrongs)


@dataclass(frozen=True, slots=True)
class SitesBox:
    """The box with its sites, ``ppf up`` beside it with its pool served, and the box's
    working addresses (``honest``: the interceptors left out, as ppf serves)."""

    world: World
    up: UpBeside
    honest: set[str]

    def lets_in(self, site: str) -> float:
        """The share of the served proxies whose exit ``site`` lets in."""
        return len(self.world.gets_through(site) & self.honest) / len(self.honest)


@contextlib.asynccontextmanager
async def sites_box(
    root: Path, tree: Path | None = None, own_exits: int = 25, other_sites: int = 0
) -> AsyncIterator[SitesBox]:
    """The box of ``ppf bench sites`` and its test (its seven proxies and ``own_exits``
    more, each its own exit; ``other_sites`` that let every exit in), once ``ppf up``
    (of this tree, or of ``tree``) serves every working proxy of it."""
    box = World(root / "w", dead_each=1, own_exits=own_exits, sites=True, other_sites=other_sites)
    with (
        box as world,
        up_beside(world, root, "--agents-idle", "1", cwd=tree) as up,
    ):
        await up.started()
        began = time.monotonic()
        await up.add_source(world.page_url)
        honest = {a for a, name in world.via().items() if not name.startswith("mitm")}
        while await served(up.base) != honest:
            if time.monotonic() - began > 180:
                raise RuntimeError(f"the pool did not come: {up.log.read_text()[-1500:]}")
            await asyncio.sleep(1)
        yield SitesBox(world, up, honest)


def rates_of(rate: float, paced_rate: float) -> dict[str, float]:
    """Each box site's requests a second: ``paced_rate`` to the one that paces."""
    return {s.name: paced_rate if s.way == "paced" else rate for s in SITES}


async def bench_sites(bench: Sites) -> dict[str, Any]:
    """``ppf bench sites``: the box's sites (ops/lab/sitebox.py), ``ppf up`` beside it
    (of this tree, or of ``tree``: another commit's checkout, measured in the same
    box), a consumer naming no site at a stated rate to each: the share of real pages
    over the first minute of learning beside the share of exits the site lets in
    (never worse than blind), then, after ``learn_s`` of learning in all, the share
    over ``measured_s`` more, by scheme; at the end ``works_on`` against the box's
    truth (precision, recall)."""
    rates = rates_of(bench.rate, bench.paced_rate)
    with tempfile.TemporaryDirectory(prefix="ppf-bench-sites-") as tmp:
        async with sites_box(Path(tmp), bench.tree, bench.own_exits, bench.other_sites) as box:
            world, up = box.world, box.up
            token = await up.cli("token", "issue", "bench", "--role", "consumer")
            consumer = Consumer(f"http://bench:{token}@{up.serve}", world.exit_ips())
            others = [other_site(i) for i in range(bench.other_sites)]
            visited = await consumer.visit(others) if others else 0
            await consumer.send(rates, 60)
            first = {s.name: consumer.share(s.name) for s in SITES}
            consumer.reset()
            await consumer.send(rates, max(0.0, bench.learn_s - 60))
            consumer.reset()
            await consumer.send(rates, bench.measured_s)
            sites: dict[str, dict[str, Any]] = {}
            for site in SITES:
                share, asked = first[site.name]
                lets_in = box.lets_in(site.name)
                figures: dict[str, Any] = {
                    "way": site.way,
                    "lets_in": round(lets_in, 3),
                    "first_minute": round(share, 3),
                    "first_minute_asked": asked,
                    "never_worse_than_blind": share >= lets_in - 0.05,
                }
                for scheme in SCHEMES:
                    got, asked = consumer.share(site.name, (scheme,))
                    figures[scheme] = round(got, 4)
                    figures[f"{scheme}_asked"] = asked
                    wrong = consumer.tally.get((site.name, scheme), (0, []))[1]
                    figures[f"{scheme}_wrong"] = sorted(set(w[:40] for w in wrong))[:3]
                sites[site.name] = figures
            await _works_on(up.base, world, box.honest, sites)
            return {
                "tree": str(bench.tree or "this"),
                "exits": len(world.exit_ips()),
                "other_sites": {"asked": len(others), "got_a_page": visited},
                "rates": rates,
                "learn_s": bench.learn_s,
                "measured_s": bench.measured_s,
                "sites": sites,
                "root_asks": world.root_asks(),
                "elsewhere": len(consumer.elsewhere),
            }


async def _works_on(
    base: str, world: World, honest: set[str], sites: dict[str, dict[str, Any]]
) -> None:
    """``works_on`` of each site against the box's truth, waited for up to 90 s (the
    endpoint's verdicts reach the log once a minute); a tree without it: None."""
    deadline = time.monotonic() + 90
    while True:
        for site in SITES:
            try:
                said = await served(base, site.name)
            except Refused:
                sites[site.name]["precision"] = sites[site.name]["recall"] = None
                continue
            p, r = precision_recall(said, world.gets_through(site.name) & honest)
            sites[site.name]["precision"], sites[site.name]["recall"] = round(p, 3), round(r, 3)
        good = all(
            (s["precision"] or 0) >= 0.95 and (s["recall"] or 0) >= 0.8 for s in sites.values()
        )
        if good or time.monotonic() > deadline:
            return
        await asyncio.sleep(2)


async def served(base: str, works_on: str | None = None) -> set[str]:
    """The proxies ``GET /v1/proxies`` serves (those that work on ``works_on``), as
    ``ip:port``."""
    page = await gateway_json(base, lambda api: api.proxies(limit=0, works_on=works_on))
    return {f"{p['ip']}:{p['port']}" for p in page["proxies"]}
