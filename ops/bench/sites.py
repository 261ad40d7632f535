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
from ops.lab.sitebox import SITES, real_page_of
from ops.lab.world import World

__all__ = [
    "SCHEMES",
    "Consumer",
    "SitesBox",
    "bench_sites",
    "precision_recall",
    "served",
    "sites_box",
]

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


@dataclass(frozen=True, slots=True)
class SitesBox:
    """The box with its three sites, ``ppf up`` beside it with its pool served, and the
    box's working addresses (``honest``: the interceptors left out, as ppf serves)."""

    world: World
    up: UpBeside
    honest: set[str]


@contextlib.asynccontextmanager
async def sites_box(root: Path, tree: Path | None = None) -> AsyncIterator[SitesBox]:
    """The box of ``ppf bench sites`` and its test, once ``ppf up`` (of this tree, or of
    ``tree``) serves every working proxy of it."""
    with (
        World(root / "w", dead_each=1, extra_working=10, sites=True) as world,
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


async def bench_sites(bench: Sites) -> dict[str, Any]:
    """``ppf bench sites``: the box's three sites (ops/lab/sitebox.py), ``ppf up`` beside
    it (of this tree, or of ``tree``: another commit's checkout, measured in the same
    box), a consumer naming no site: ``learn`` requests to each site over each scheme,
    then ``measured`` more; the share of those that got the real page, and at the end of
    learning ``works_on`` against the box's truth (precision, recall)."""
    learn, measured, tree = bench.learn, bench.measured, bench.tree
    with tempfile.TemporaryDirectory(prefix="ppf-bench-sites-") as tmp:
        async with sites_box(Path(tmp), tree) as box:
            world, up, honest = box.world, box.up, box.honest
            token = await up.cli("token", "issue", "bench", "--role", "consumer")
            exits = {p.exit_ip for p in world.proxies}
            consumer = Consumer(f"http://bench:{token}@{up.serve}", exits)
            await consumer.send([s.name for s in SITES], learn)
            consumer.reset()
            await consumer.send([s.name for s in SITES], measured)
            sites: dict[str, dict[str, Any]] = {}
            for site in SITES:
                figures: dict[str, Any] = {}
                for scheme in SCHEMES:
                    got, wrong = consumer.tally[(site.name, scheme)]
                    figures[scheme] = round(got / measured, 4)
                    figures[f"{scheme}_wrong"] = sorted(set(w[:40] for w in wrong))[:3]
                sites[site.name] = figures
            await _works_on(up.base, world, honest, sites)
            return {
                "tree": str(tree or "this"),
                "learn": learn,
                "measured": measured,
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
