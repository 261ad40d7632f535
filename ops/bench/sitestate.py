"""``ppf bench site-state``: what per-site standing costs a gateway at a large pool.

Two logs, each on its own real nats-server, on loopback: the pinned workload
(ops/bench/workload.py) as rounds over ``proxies`` proxies (A), and the same followed by
``sites`` sites' verdicts on ``cells`` proxies each, as a trusted checker's
``SitesChecked`` rounds, two in three through and one in three turned away (B: the
``sites`` table at its caps). A first gateway on each locates every address and a
``ppf snapshot`` is taken of each. Then, interleaved A B A B, a new ``ppf gateway``
process (its own interpreter, as deployed) on each: the seconds from its spawn until it
is ready from the snapshot (``/readyz``), its resident memory once its pool view is
built, and, once its first checkpoint is committed, the p99 of ``asks`` ``/v1/stats``
and ``POST /v1/leases`` (one source, as an enrolled worker), one after the other.

With ``tree`` (another commit's checkout, the one per-site standing started from), A is
that tree's instead: a copy of log B's store, that tree's own ``ppf snapshot`` of it (an
older build refuses this one's snapshot and folds the log itself; verdicts it does not
know are refused), and that tree's gateway on it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from eventlog.client import Log
from events import AgentEnrolled, SiteResult, SitesChecked, token_sha256
from events.mint import fresh_id, now_ms
from gatewayapi import GatewayApi
from ops.bench.gateway import _pct, _settled
from ops.bench.harness import Workload, publish_workload
from ops.bench.options import SiteState
from ops.bench.snapshot import _gateway, _ready_at
from ops.bench.stats import stats_then_lease
from ops.bench.workload import _ip
from ops.nats.server import NatsServer, free_port

__all__ = ["bench_site_state"]

TOKEN = "bench-site-state-token"  # the leasing worker's (a bench's own log)
CHECKER = "c000"  # the workload's trusted checker (ops/bench/workload.py)


def _port_of(p: int) -> int:
    return 1024 + p % 50_000  # as the workload's proxies (ops/bench/workload.py _worked)


def _verdicts(proxies: int, sites: int, cells: int) -> list[SitesChecked]:
    """``cells`` proxies of each of ``sites`` sites, in rounds of 500: the sites table
    at its caps (reducers/sites.py MAX_CELLS a site)."""
    rounds = []
    for k in range(sites):
        site = f"site{k:03d}.example.com"
        first = (k * 997) % proxies
        results = [
            SiteResult(
                ip=_ip(p),
                port=_port_of(p),
                site=site,
                through=int(i % 3 != 2),
                blocked=int(i % 3 == 2),
                status=2 if i % 3 != 2 else 4,
                latency_ms=300,
                bytes=4_096,
            )
            for i, p in enumerate((first + j) % proxies for j in range(cells))
        ]
        for start in range(0, len(results), 500):
            rounds.append(
                SitesChecked(
                    id=fresh_id(), agent=CHECKER, at=now_ms(), key=f"s{k % 256:03d}",
                    results=results[start : start + 500],
                )
            )  # fmt: skip
    return rounds


async def _log(
    workdir: Path, name: str, observations: int, proxies: int, sites: int, cells: int
) -> NatsServer:
    server = NatsServer(workdir / f"nats-{name}", port=free_port())
    server.start()
    await publish_workload(Workload([server.url], "r", observations, proxies, 1))
    lg = await Log.connect(server.url)
    try:
        await lg.publish(
            AgentEnrolled(
                id=fresh_id(), agent="admin", at=now_ms(), name="wbench", role="worker",
                token_sha256=token_sha256(TOKEN),
            )
        )  # fmt: skip
        if sites:
            rounds = _verdicts(proxies, sites, cells)
            for start in range(0, len(rounds), 200):
                await lg.publish_many(rounds[start : start + 200])
    finally:
        await lg.close()
    port = free_port()
    locator = await asyncio.to_thread(_gateway, server.url, port, workdir / f"locate-{name}.log")
    try:
        await _ready_at(port, locator, timeout=3600)
        await _settled(f"http://127.0.0.1:{port}", quiet_s=3.0, timeout=3600)
    finally:
        locator.terminate()
        await asyncio.to_thread(locator.wait, 60)
    taken = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ops.cli", "snapshot", "--nats", server.url],
        capture_output=True,
        timeout=3600,
    )
    if taken.returncode != 0:
        raise RuntimeError(f"ppf snapshot failed: {taken.stderr.decode()[-500:]}")
    return server


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _tree_log(workdir: Path, of: NatsServer, tree: Path) -> NatsServer:
    """A copy of ``of``'s store on a server of its own, with ``tree``'s own snapshot."""
    of.stop()
    store = workdir / "nats-tree"
    await asyncio.to_thread(shutil.copytree, workdir / "nats-with", store)
    of.start()
    server = NatsServer(store, port=free_port())
    server.start()
    taken = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ops.cli", "snapshot", "--nats", server.url],
        capture_output=True,
        timeout=3600,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if taken.returncode != 0:
        raise RuntimeError(f"{tree}'s ppf snapshot failed: {taken.stderr.decode()[-500:]}")
    return server


async def _first_checkpoint(api: GatewayApi, timeout: float = 60) -> None:
    """Until the gateway's first checkpoint is committed (``digest_seq`` in /v1/stats):
    every row of the snapshot written by the checkpoint child, a second or so of a core
    that, on two, slows the asks of whichever run it falls in. The p99s are of a
    gateway past its start, whose cost is the start's figure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await api.stats()).object().get("digest_seq", 0) > 0:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no checkpoint within {timeout} s")


async def _one(
    url: str, workdir: Path, name: str, asks: int, tree: Path | None = None
) -> dict[str, float]:
    """One gateway on ``url`` (``tree``'s, when given): its start from the snapshot, its
    memory, its p99s."""
    port = free_port()
    t0 = time.monotonic()
    logfile = workdir / f"{name}.log"
    proc = await asyncio.to_thread(_gateway, url, port, logfile, tree=tree)
    try:
        await _ready_at(port, proc, timeout=600)
        start_s = time.monotonic() - t0
        stats_ms: list[float] = []
        lease_ms: list[float] = []
        body = {"agent": "wbench", "kind": "source", "count": 1, "ttl_s": 600}
        async with aiohttp.ClientSession() as http:
            api = GatewayApi(http, f"http://127.0.0.1:{port}", token=TOKEN)
            await api.proxies(limit=1)  # the pool view, built
            await asyncio.sleep(2)
            rss = _rss_mb(proc.pid)
            await _first_checkpoint(api)
            for _ in range(asks):
                stats, lease, status = await stats_then_lease(api, body)
                if status != 200:
                    raise RuntimeError(f"lease: {status}")
                stats_ms.append(stats)
                lease_ms.append(lease)
        return {
            "start_s": round(start_s, 2),
            "rss_mb": round(rss),
            "stats_p99_ms": round(_pct(stats_ms, 0.99), 2),
            "lease_p99_ms": round(_pct(lease_ms, 0.99), 2),
        }
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 60)


async def bench_site_state(state: SiteState) -> dict[str, Any]:
    observations, proxies, runs, tree = state.observations, state.proxies, state.runs, state.tree
    sites, cells, asks = state.sites, state.cells, state.asks
    with tempfile.TemporaryDirectory(prefix="ppf-bench-site-state-") as tmp:
        workdir = Path(tmp)
        servers = {"with": await _log(workdir, "with", observations, proxies, sites, cells)}
        if tree is None:
            servers["without"] = await _log(workdir, "without", observations, proxies, 0, cells)
        else:
            servers["without"] = await _tree_log(workdir, servers["with"], tree)
        trees = {"without": tree, "with": None}
        try:
            seen: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
            for run in range(runs):  # A B A B
                for side in ("without", "with"):
                    url = servers[side].url
                    seen[side].append(await _one(url, workdir, f"{side}-{run}", asks, trees[side]))
        finally:
            for server in servers.values():
                server.stop()
    medians = {
        side: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for side, rows in seen.items()
    }
    a, b = medians["without"], medians["with"]
    return {
        "without": str(tree) if tree is not None else "this tree, no verdicts",
        "proxies": proxies,
        "sites": sites,
        "cells": sites * cells,
        "runs": seen,
        "medians": medians,
        "more_mb": round(b["rss_mb"] - a["rss_mb"]),
        "ratio": {k: round(b[k] / a[k], 3) if a[k] else None for k in a if k != "rss_mb"},
    }
