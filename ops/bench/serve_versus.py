"""``ppf bench serve --versus DIR``: the endpoint's CPU a request, this tree's against
another checkout's (``git worktree add DIR REV``), in interleaved runs (A B A B).

For each load (plain HTTP through an HTTP upstream and through a SOCKS5 one; requests
inside long-lived CONNECT tunnels, ``TUNNELS`` of them), each tree's endpoint runs in a
process of its own, over a pool of the one upstream, under the same client: a warm-up,
then ``requests`` measured (the process's user + system time, from ``/proc``). The
endpoint is started from either tree's modules: the rooms' names, or the names the
endpoint had before it was split into rooms.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ops.bench.serve import SITE, TOKEN, _cpu_split_s, _load
from ops.bench.upstreams import upstream
from ops.nats.server import free_port

__all__ = ["LOADS", "bench_serve_versus"]

LOADS = ("http", "socks5", "tunnel")
TUNNELS = 20
WARM = 400  # requests before each measured run

# The endpoint alone over a pool of one upstream, from whichever tree is on the path.
_CHILD = """
import asyncio, sys, structlog
try:
    from endpoint.connection.client import serve
    from endpoint.link.upstream import Upstream
    from endpoint.router.choose import Pool
    from endpoint.router.router import Router
except ImportError:  # before the rooms
    from endpoint.choose import Pool, Upstream
    from endpoint.relay import Endpoint as Router, serve
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
port, up, proto, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

async def main():
    pool = Pool()
    pool.replace([Upstream("127.0.0.1", up, proto, https="yes", latency_ms=5)])
    async def login_ok(name, tok):
        return tok == token
    await serve(Router(pool, login_ok, max_per_consumer=100_000, lab=True), "127.0.0.1", port)
    print("ready", flush=True)
    await asyncio.Event().wait()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


async def _in_tunnels(port: int, target: int, requests: int) -> int:
    """``requests`` GETs inside ``TUNNELS`` CONNECT tunnels, one after another in each."""
    auth = base64.b64encode(f"bench:{TOKEN}".encode())
    answered = 0

    async def one(count: int) -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n"
            % (target, auth)
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        for _ in range(count):
            writer.write(b"GET /page HTTP/1.1\r\nHost: bench\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            answered += 1
        writer.close()

    await asyncio.gather(*(one(requests // TUNNELS) for _ in range(TUNNELS)))
    return answered


async def _one_run(
    tree: Path, load: str, up_port: int, proto: str, target: int, requests: int
) -> tuple[float, float]:
    """The endpoint of ``tree`` under one measured run: its CPU µs a request, and the
    system's share of it (the kernel's work for its sockets, which Python changes do
    not touch: the larger it is on a host, the nearer two trees' ratio is to 1)."""
    port = free_port()
    # -S: no site module, so no editable install's finder maps ppf's packages to this
    # tree whatever the path says; the installed packages are put on the path by hand.
    path = f"{tree}{os.pathsep}{sysconfig.get_paths()['purelib']}"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-S", "-c", _CHILD, str(port), str(up_port), proto, TOKEN,
        stdout=asyncio.subprocess.PIPE, cwd=tree, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    try:
        assert child.stdout is not None
        async with asyncio.timeout(30):
            await child.stdout.readline()
        through = f"http://bench:{TOKEN}@127.0.0.1:{port}"
        url = f"http://127.0.0.1:{target}/page"
        if load == "tunnel":
            await _in_tunnels(port, target, WARM)
            before = _cpu_split_s(child.pid)
            answered = await _in_tunnels(port, target, requests)
        else:
            await _load(through, url, WARM, 20)
            before = _cpu_split_s(child.pid)
            _, answered = await _load(through, url, requests, 20)
        user, system = (b - a for a, b in zip(before, _cpu_split_s(child.pid), strict=True))
        assert answered == requests, f"{tree}: {load}: {answered} of {requests} answered"
        return (user + system) / requests * 1e6, system / max(user + system, 1e-9)
    finally:
        child.terminate()
        await child.wait()


async def bench_serve_versus(
    other: Path,
    requests: int = 10_000,
    runs: int = 3,
    loads: tuple[str, ...] = LOADS,
    site_closes: bool = False,
    site_html: bool = False,
) -> dict[str, Any]:
    """Each load in turn, this tree (new) and ``other`` (old) interleaved ``runs`` times;
    ``site_closes``: the site closes each connection after its answer; ``site_html``:
    it answers a page of HTML, which the endpoint reads."""
    trees = {"old": other.resolve(), "new": Path(__file__).resolve().parents[2]}
    target = free_port()
    site = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SITE, str(target),
        env={
            **os.environ,
            "SITE_CLOSES": "1" if site_closes else "0",
            "SITE_HTML": "1" if site_html else "0",
        },
    )  # fmt: skip
    out: dict[str, Any] = {
        "versus": str(trees["old"]), "requests": requests, "runs": runs,
        "site_closes": site_closes, "site_html": site_html,
    }  # fmt: skip
    try:
        await asyncio.sleep(0.5)
        for load in loads:
            async with upstream("http" if load == "tunnel" else load) as up:
                cpu: dict[str, list[float]] = {"old": [], "new": []}
                kernel: dict[str, list[float]] = {"old": [], "new": []}
                for _ in range(runs):  # A B A B
                    for name, tree in trees.items():
                        us, share = await _one_run(tree, load, up.port, up.kind, target, requests)
                        cpu[name].append(us)
                        kernel[name].append(share)
            old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
            out[load] = {
                "upstream": up.program,
                "old_cpu_us": round(old, 1),
                "new_cpu_us": round(new, 1),
                "new_over_old": round(new / old, 3),
                "by_pair": [round(n / o, 3) for o, n in zip(cpu["old"], cpu["new"], strict=True)],
                "spread_old": [round(c, 1) for c in cpu["old"]],
                "spread_new": [round(c, 1) for c in cpu["new"]],
                "system_share_old": round(statistics.median(kernel["old"]), 2),
                "system_share_new": round(statistics.median(kernel["new"]), 2),
            }
    finally:
        site.terminate()
        await site.wait()
    return out
