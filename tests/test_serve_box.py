"""The rotating endpoint of `ppf up` in the world in a box, with its own worker and
checker: a consumer's 10,000 requests (half plain HTTP, half HTTPS through CONNECT) while
a third of the pool dies; every answer came through a proxy, and the dead leave alive."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ops.lab.churn import Down, Plan
from ops.lab.world import LINK_HOST, World, unavailable
from ops.nats.server import free_port
from tests.helpers import endpoint_counts
from tests.test_cli import Up

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

PROXIES = 9
DIE_AT_S = 40  # simulated = wall seconds (speed 1) after the box starts: the pool is served
# at about 6 s, and the first half of the requests done by about 18
DEAD = (0, 3, 6)  # a third: refused, silent, tarpit
HOW = ("refusing", "silent", "tarpit")
PLAN = Plan(
    profile="serve",
    seed=0,
    duration_ms=3_600_000,
    servers=("microsocks", "tinyproxy") * 4 + ("microsocks",),
    rtt_ms=tuple(20 + 5 * i for i in range(PROXIES)),
    downs=tuple(
        (Down(DIE_AT_S * 1000, 3_600_000, HOW[DEAD.index(i)]),) if i in DEAD else ()
        for i in range(PROXIES)
    ),
)
REQUESTS = 10_000
CONCURRENCY = 20  # and as many connections kept open (tunnels stay alive between requests)


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


async def _cli(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, argv
    return out.decode().strip()


async def _traffic(
    endpoint: str, token: str, plain: str, secure: str, count: int, exits: set[str]
) -> tuple[int, list[str]]:
    """``count`` requests through the endpoint, alternately plain and through CONNECT, at
    CONCURRENCY at once: (answered with the page, what went wrong otherwise). A page
    whose caller was not a proxy's exit (a direct connection, another origin) fails the
    test at once: no answer may come from anywhere else."""
    proxy = f"http://shop:{token}@{endpoint}"
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    answered = 0
    wrong: list[str] = []
    elsewhere: list[str] = []
    queue = iter(range(count))
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def one() -> None:
            nonlocal answered
            for i in queue:
                url = secure if i % 2 else plain
                try:
                    async with http.get(url, proxy=proxy, ssl=context) as r:
                        text = await r.text()
                        if r.status != 200:
                            wrong.append(
                                f"{r.status} {'plain' if url == plain else 'tls'} {text[:60]}"
                            )
                            continue
                        seen = json.loads(text)["origin"] if url == plain else text.strip()
                        elsewhere.extend([] if seen in exits else [f"{url}: {seen[:60]}"])
                        answered += 1
                except aiohttp.ClientHttpProxyError as exc:
                    wrong.append(f"proxy {exc.status} {exc.message[:50]}")
                except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                    wrong.append(repr(exc)[:120])

        await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
    assert not elsewhere, f"answered from elsewhere than a proxy's exit: {elsewhere[:5]}"
    return answered, wrong


def _chain(logfile: Path, proxies: set[str]) -> list[str]:
    """What ppf up said of a dead proxy still served, and of each link between the
    endpoint meeting it and a check taking it out: the endpoint's failures through it
    (how many, the first and the last), its reports not sent, the checker's rounds and
    judges."""
    links = ("recheck_", "judge_benched", "traffic_not_sent", "feed_failed")
    said = logfile.read_text(errors="replace").splitlines()
    failures = [s for s in said if '"serve_upstream_failed"' in s and any(p in s for p in proxies)]
    others = [
        line[:300]
        for line in said
        if '"serve_upstream_failed"' not in line
        and (any(p in line for p in proxies) or any(f'"{k}' in line for k in links))
    ]
    met = [f"the endpoint failed through it {len(failures)} times", *failures[:1], *failures[-1:]]
    return [*met, *others[-20:]]


@pytest.mark.timeout(420)
async def test_ten_thousand_requests_through_the_endpoint_while_a_third_dies(
    tmp_path: Path, ppf_bin: str
) -> None:
    """A consumer's 10,000 requests through `ppf up`'s endpoint, half plain HTTP to the
    box's httpbin and half HTTPS through CONNECT, while three of nine proxies die
    (refused, silent, tarpit): at least 99 % answered with a proxy's exit as the caller,
    the dead out of alive within 60 s (the endpoint's reports queue them for ppf up's
    checker), and /metrics counting what the endpoint carried."""
    with World(tmp_path / "w", churn=PLAN, speed=1.0) as world:
        judge_port, tls_port = free_port(), free_port()
        up = Up(
            ppf_bin,
            tmp_path / "data",
            "--no-seed",
            *("--judge", world.judges["httpbin"]),
            *("--public-url", f"http://{LINK_HOST}:{judge_port}/judge"),
            *("--judge-listen", f"{LINK_HOST}:{judge_port}"),
            *("--judge-tls-listen", f"{LINK_HOST}:{tls_port}"),
            *("--https-target", world.https_url),
            *("--agents-idle", "1"),
        )
        await asyncio.to_thread(up.start)
        try:
            await _cli(ppf_bin, "sources", "add", world.churn_page_url, "--nats", up.nats)
            churn = {f"{a}:{p}" for a, p in world.churn_addresses()}
            served: set[str] = set()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and served != churn:
                rows = (await asyncio.to_thread(_json, up.base + "/v1/proxies?limit=0"))["proxies"]
                served = {f"{p['ip']}:{p['port']}" for p in rows}
                await asyncio.sleep(1)
            assert served == churn, (sorted(served), sorted(churn))
            assert time.time() < world.churn_t0 + DIE_AT_S - 10, "the pool came too late"
            token = await _cli(
                ppf_bin, "token", "issue", "shop", "--role", "consumer", "--nats", up.nats
            )
            endpoint = f"127.0.0.1:{up.serve_port}"
            plain = world.judges["httpbin"]
            secure = world.https_url.replace("/generate_204", "/ip")
            exits = {a for a, _ in world.churn_addresses()}
            # What a user does when the fleet has just started: try until it answers (the
            # endpoint asks the gateway for the pool every second while it has none).
            for _ in range(30):
                got, _ = await _traffic(endpoint, token, plain, secure, 2, exits)
                if got == 2:
                    break
                await asyncio.sleep(1)
            half = REQUESTS // 2
            first, wrong1 = await _traffic(endpoint, token, plain, secure, half, exits)
            # The second half starts just before the deaths: they come mid-run.
            await asyncio.sleep(max(0.0, world.churn_t0 + DIE_AT_S - 2 - time.time()))
            second, wrong2 = await _traffic(endpoint, token, plain, secure, half, exits)
            died_at = world.churn_t0 + DIE_AT_S
            answered = first + second
            kinds = Counter(w[:70] for w in wrong1 + wrong2)
            assert answered >= 0.99 * REQUESTS, (answered, first, second, kinds.most_common(8))
            dead = {f"{a}:{p}" for i, (a, p) in enumerate(world.churn_addresses()) if i in DEAD}
            alive: set[str] = set(dead)
            while alive & dead and time.time() < died_at + 60:
                rows = (await asyncio.to_thread(_json, up.base + "/v1/proxies?limit=0"))["proxies"]
                alive = {f"{p['ip']}:{p['port']}" for p in rows}
                await asyncio.sleep(1)
            assert not alive & dead, (
                f"still alive {time.time() - died_at:.0f} s after: {alive & dead}",
                _chain(up.logfile, alive & dead),
                [s for s in (world.root / "inet.log").read_text().splitlines() if "churn" in s],
            )
            counted = await endpoint_counts(up.base)
            # Plain requests one by one; HTTPS is opaque inside its tunnels, which clients
            # keep open for many requests each.
            assert counted["forwarded"] >= 0.99 * REQUESTS / 2, counted
            assert 0 < counted["tunnel"] < REQUESTS / 2, counted
        finally:
            assert await asyncio.to_thread(up.stop) == 0
