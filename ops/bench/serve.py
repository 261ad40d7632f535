"""``ppf bench serve``: what the rotating endpoint costs, beside going directly through
the same upstream proxy, in one run.

Four processes on loopback: a target site (aiohttp), the upstream (of each kind in turn,
``ops/bench/upstreams.py``: an HTTP proxy, a SOCKS5 one; no package needed), the
endpoint (``endpoint/router/router.py`` over a pool of that one upstream, its login checked
against one token: no gateway in the way), and the client here (aiohttp, with
``proxy=``). Directly and through the endpoint in turns (A B A B, ``runs`` each):

- requests a second at ``concurrency`` (``requests`` each run);
- the endpoint's own CPU per request (its process's user + system time over the
  requests it carried, from ``/proc``);
- the latency it adds: the median of ``latency_requests`` one after another at
  concurrency 1 to 4, through it less directly;
- memory per open tunnel: ``tunnels`` CONNECT tunnels held open to the target, the
  endpoint's resident memory after less before, over their count.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from ops.bench.options import KINDS, Serve
from ops.bench.upstreams import Running, upstream
from ops.nats.server import free_port

__all__ = ["SITE", "bench_serve", "child"]

TOKEN = "bench-token"

# The benches' site (its own process): 512 bytes on any path, plain HTTP on the port of
# argv[1], and with argv[2:5] (a port, a certificate, its key) HTTPS on that port too.
# With SITE_CLOSES=1 in its environment it closes each connection after its answer, as
# an HTTP/1.0 server does: then every request through a SOCKS5 upstream opens a link.
# With SITE_HTML=1 it answers a titled page of HTML, about 20 KB, as a shop's pages are:
# the endpoint reads each for a block (endpoint/router/verdicts.py), not text/plain.
SITE = """
import asyncio, os, ssl, sys
from aiohttp import web
from gateway.guard import listen

CLOSES = os.environ.get("SITE_CLOSES") == "1"
HTML = os.environ.get("SITE_HTML") == "1"
SHOP = (
    "<!doctype html><html><head><meta charset=utf-8><title>A shop: item 12</title>"
    + '<link rel=stylesheet href="/s.css">' * 20 + "</head><body>"
    + "<p>An item, its price and what buyers said of it.</p>" * 360 + "</body></html>"
)

async def main():
    async def page(request):
        if HTML:
            answer = web.Response(text=SHOP, content_type="text/html")
        else:
            answer = web.Response(text="x" * 512)
        if CLOSES:
            answer.force_close()
        return answer
    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await listen(runner, "127.0.0.1", int(sys.argv[1]))
    if len(sys.argv) > 2:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(sys.argv[3], sys.argv[4])
        await listen(runner, "127.0.0.1", int(sys.argv[2]), ssl_context=tls)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def child(port: int, upstream: int, proto: str = "http") -> None:
    """The endpoint alone, over a pool of one upstream (run in its own process)."""
    import structlog

    from endpoint.connection.client import serve
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    async def main() -> None:
        pool = Pool()
        pool.replace([Upstream("127.0.0.1", upstream, proto, https="yes", latency_ms=5)])

        async def login_ok(name: str, token: str) -> bool:
            return token == TOKEN

        endpoint = Router(pool, login_ok, max_per_consumer=100_000, lab=True)  # loopback origin
        await serve(endpoint, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop  # as ppf serve runs (ops/cli/__init__.py)

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def _cpu_s(pid: int) -> float:
    user, system = _cpu_split_s(pid)
    return user + system


def _cpu_split_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _session(proxy: str, **connector: Any) -> tuple[aiohttp.ClientSession, str | None]:
    """A client session through ``proxy`` (http:// as aiohttp's ``proxy=``, socks5://
    through aiohttp-socks), and the ``proxy=`` its requests pass."""
    if proxy.startswith("socks5://"):
        from aiohttp_socks import ProxyConnector

        return aiohttp.ClientSession(connector=ProxyConnector.from_url(proxy, **connector)), None
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector)), proxy


async def _load(proxy: str, url: str, requests: int, concurrency: int) -> tuple[float, int]:
    """(requests a second, answered) through ``proxy``."""
    left = iter(range(requests))
    ok = 0
    session, via = _session(proxy, limit=concurrency)
    async with session as http:

        async def one() -> None:
            nonlocal ok
            for _ in left:
                async with http.get(url, proxy=via) as r:
                    await r.read()
                    ok += r.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        return requests / (time.perf_counter() - started), ok


async def _latencies(proxy: str, url: str, requests: int, concurrency: int) -> float:
    """The median latency (ms) of ``requests`` at ``concurrency``, each on a new client
    connection (as a scraper with a fresh proxy connection per request)."""
    samples: list[float] = []
    left = iter(range(requests))
    session, via = _session(proxy, force_close=True)
    async with session as http:

        async def one() -> None:
            for _ in left:
                started = time.perf_counter()
                async with http.get(url, proxy=via) as r:
                    await r.read()
                samples.append((time.perf_counter() - started) * 1000)

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return statistics.median(samples)


async def _tunnels(endpoint: str, target_port: int, count: int, pid: int) -> float:
    """KiB of the endpoint's memory per CONNECT tunnel held open."""
    before = _rss_kb(pid)
    opened = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(*endpoint.split(":"))
        import base64

        auth = base64.b64encode(f"bench:{TOKEN}".encode()).decode()
        writer.write(
            f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\nHost: 127.0.0.1:{target_port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head:
            raise RuntimeError(f"tunnel refused: {head[:80]!r}")
        opened.append(writer)
    await asyncio.sleep(0.5)
    after = _rss_kb(pid)
    for writer in opened:
        writer.close()
    return (after - before) / count


async def bench_serve(serve: Serve, latency_requests: int = 400) -> dict[str, Any]:
    """Each kind of upstream in turn (ops/bench/upstreams.py), its figures apart:
    ``serve.requests`` (5,000 unless said) a run."""
    requests, concurrency, runs = serve.requests or 5_000, serve.concurrency, serve.runs
    tunnels, kinds = serve.tunnels, tuple(serve.upstream or KINDS)
    target_port = free_port()
    target = await asyncio.create_subprocess_exec(sys.executable, "-c", SITE, str(target_port))
    out: dict[str, Any] = {"requests": requests, "concurrency": concurrency, "runs": runs}
    try:
        await asyncio.sleep(0.5)
        for kind in kinds:
            async with upstream(kind) as up:
                held = tunnels if kind == kinds[0] else 0  # the tunnels' memory once
                load = (requests, concurrency, runs, latency_requests, held)
                figures = await _through(up, target_port, *load)
                out[kind] = {"upstream": up.program, **figures}
    finally:
        target.terminate()
        await target.wait()
    return out


async def _through(
    up: Running,
    target_port: int,
    requests: int,
    concurrency: int,
    runs: int,
    latency_requests: int,
    tunnels: int,
) -> dict[str, Any]:
    """Directly through ``up`` and through an endpoint over it, in turns."""
    endpoint_port = free_port()
    relay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"from ops.bench.serve import child; child({endpoint_port}, {up.port}, {up.kind!r})",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert relay.stdout is not None
        async with asyncio.timeout(30):
            await relay.stdout.readline()
        url = f"http://127.0.0.1:{target_port}/page"
        direct = up.url
        through = f"http://bench:{TOKEN}@127.0.0.1:{endpoint_port}"
        rates: dict[str, list[float]] = {"direct": [], "endpoint": []}
        cpu_us: list[float] = []
        answered = 0
        for _ in range(runs):  # A B A B
            rate, _ = await _load(direct, url, requests, concurrency)
            rates["direct"].append(rate)
            before = _cpu_s(relay.pid)
            rate, ok = await _load(through, url, requests, concurrency)
            cpu_us.append((_cpu_s(relay.pid) - before) / requests * 1e6)
            rates["endpoint"].append(rate)
            answered += ok
        added = {}
        for c in (1, 2, 3, 4):
            pairs = []
            for _ in range(runs):
                d = await _latencies(direct, url, latency_requests // runs, c)
                e = await _latencies(through, url, latency_requests // runs, c)
                pairs.append(e - d)
            added[f"c{c}"] = round(statistics.median(pairs), 3)
        per_tunnel = None
        if tunnels:
            per_tunnel = await _tunnels(
                f"127.0.0.1:{endpoint_port}", target_port, tunnels, relay.pid
            )
    finally:
        relay.terminate()
        await relay.wait()
    direct_rate = statistics.median(rates["direct"])
    endpoint_rate = statistics.median(rates["endpoint"])
    return {
        "answered": answered,
        "direct_req_per_s": round(direct_rate),
        "endpoint_req_per_s": round(endpoint_rate),
        "endpoint_vs_direct": round(endpoint_rate / direct_rate, 3),
        "spread_direct": [round(r) for r in rates["direct"]],
        "spread_endpoint": [round(r) for r in rates["endpoint"]],
        # Each run's pair (direct, then through the endpoint): the machine drifts between.
        "spread_ratio": [
            round(e / d, 3) for d, e in zip(rates["direct"], rates["endpoint"], strict=True)
        ],
        "endpoint_cpu_us_per_request": round(statistics.median(cpu_us), 1),
        "spread_cpu_us": [round(c, 1) for c in cpu_us],
        "added_latency_ms_median": added,
        **({"tunnel_kib": round(per_tunnel, 1)} if per_tunnel is not None else {}),
    }
