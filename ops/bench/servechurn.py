"""``ppf bench serve-churn``: the rotating endpoint's answers and tail in the churn lab
(root: the world in a box), with hedged connects and without, at the same time.

The box's churn lab (ops/lab/churn.py): ``PROXIES`` proxies (microsocks and tinyproxy in
turn) behind relays of 100 to 390 ms round trip; a third of them die at ``DIE_AT_S`` and
``DIE_AT_S + 60`` s of the box's time, in turns refused, silent and a tarpit (it accepts
and never answers: a hanging upstream). ``ppf up`` beside it learns the pool from the
lab's page; once it serves every proxy, a consumer's ``requests`` requests go through its
endpoint (hedged connects on) while a quarter as many go through a second ``ppf serve``
fed by the same gateway with ``--serve-hedges 0``, both from the load generator
(ops/bench/loadgen.py), half plain HTTP to the box's httpbin and half HTTPS through
CONNECT to its HTTPS site, keep-alive off (a request, an upstream); the deaths come
while they run. A real answer is the site's 200; lost is no answer at all.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.bench.loadgen import Load, Result, generate
from ops.bench.options import ServeChurn
from ops.bench.upbox import gateway_json, up_beside
from ops.lab.churn import Down, Plan
from ops.lab.world import World
from ops.nats.server import free_port

__all__ = ["bench_serve_churn"]

PROXIES = 30
DIE_AT_S = 150
HOW = ("refusing", "silent", "tarpit")


def _plan() -> Plan:
    downs: list[tuple[Down, ...]] = []
    for i in range(PROXIES):
        if i % 3:
            downs.append(())
            continue
        at_s = DIE_AT_S + 60 * ((i // 3) % 2)
        downs.append((Down(at_s * 1000, 3_600_000, HOW[(i // 3) % 3]),))
    return Plan(
        profile="serve-churn",
        seed=0,
        duration_ms=3_600_000,
        servers=("microsocks", "tinyproxy") * (PROXIES // 2),
        rtt_ms=tuple(100 + 10 * i for i in range(PROXIES)),
        downs=tuple(downs),
    )


async def _both(load: Load, proxy: str, plain: str, secure: str, tls: ssl.SSLContext) -> Result:
    """Half the load plain, half through CONNECT, at once; one result."""
    halves = [
        Load(mode, False, (load.requests or 0) // 2, None, None, load.concurrency // 2)
        for mode in ("http", "https")
    ]
    results = await asyncio.gather(*(generate(h, proxy, plain, secure, tls) for h in halves))
    total = Result()
    for r in results:
        total.merge(r)
    return total


async def bench_serve_churn(options: ServeChurn) -> dict[str, Any]:
    requests, concurrency = options.requests, options.concurrency
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE  # the box's own certificate
    with tempfile.TemporaryDirectory(prefix="ppf-bench-serve-churn-") as tmp:
        root = Path(tmp)
        with World(root / "w", churn=_plan(), speed=1.0) as world, up_beside(world, root) as up:
            await up.started()
            await up.add_source(world.churn_page_url)
            churn = {f"{a}:{p}" for a, p in world.churn_addresses()}
            deadline = time.monotonic() + 300
            served: set[str] = set()
            while served != churn and time.monotonic() < deadline:
                rows = await gateway_json(up.base, lambda api: api.proxies(limit=0))
                served = {f"{p['ip']}:{p['port']}" for p in rows["proxies"]}
                await asyncio.sleep(1)
            token = await up.cli("token", "issue", "shop", "--role", "consumer")
            port = free_port()
            unhedged = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ops.cli", "serve", "--gateway", up.base,
                "--listen", f"127.0.0.1:{port}", "--serve-hedges", "0",
                stdout=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:
                await asyncio.sleep(3)  # its pool, from the gateway
                plain = world.judges["httpbin"]
                secure = world.https_url.replace("/generate_204", "/ip")
                began = time.time() - world.churn_t0
                hedged, without = await asyncio.gather(
                    _both(Load("both", requests=requests, concurrency=concurrency),
                          f"http://shop:{token}@{up.serve}", plain, secure, tls),
                    _both(Load("both", requests=requests // 4, concurrency=concurrency // 4),
                          f"http://shop:{token}@127.0.0.1:{port}", plain, secure, tls),
                )  # fmt: skip
                ended = time.time() - world.churn_t0
            finally:
                unhedged.terminate()
                await unhedged.wait()
    return {
        "proxies": PROXIES,
        "served_before_traffic": len(served),
        "traffic_s": [round(began), round(ended)],
        "deaths_at_s": [DIE_AT_S, DIE_AT_S + 60],
        "hedged": _said(hedged),
        "unhedged": _said(without),
    }


def _said(result: Result) -> dict[str, Any]:
    figures = result.figures()
    figures["real_answer_share"] = round(result.ok / max(result.sent, 1), 5)
    return figures
