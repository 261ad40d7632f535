"""``ppf bench serve --workers 1,2``: the rotating endpoint as deployed, under a load of
known shape, at each number of workers in turn.

On loopback: a site (plain HTTP and HTTPS, its certificate from a CA of the bench's own),
one upstream of the kind asked (``ops/bench/upstreams.py``: an HTTP proxy or a SOCKS5
one, each tunnels; no package needed), a nats-server and a ``ppf gateway`` process whose
pool is that upstream (confirmed by the operator's checker) with one consumer
enrolled, and a ``ppf serve --workers N`` process fed by it. For each run and each N in
turn (A B A B), a new endpoint, then each load (``ops/bench/loadgen.py``: a kind, keep-
alive on or off) through it; per load, what the generator saw and the endpoint's CPU (its
processes', workers and all, from ``/proc``) over the requests sent. Figures: per N the
median of the runs; per run the ratio of the endpoint's CPU a request (each N over the
first); the requests a second one core carries, and the cores 100,000 a second take.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from events import Configured, ProxyWorked, Settings
from events.mint import enrollment, fresh_id, now_ms
from ops.bench.gateway import _system, _wait_applied
from ops.bench.loadgen import Load, generate
from ops.bench.serve import SITE
from ops.bench.upstreams import upstream
from ops.lab.tls import nats_certs
from ops.nats.server import free_port

__all__ = ["bench_serve_workers"]


def _tree_cpu_s(pid: int) -> float:
    """User + system seconds of ``pid`` and every process under it."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    mine, total = {pid}, 0.0
    changed = True
    while changed:  # every process under one already found, to a fixpoint
        changed = False
        for p, parent in parents.items():
            if parent in mine and p not in mine:
                mine.add(p)
                changed = True
    for p in mine:
        total += times.get(p, 0.0)
    return total


async def _endpoint(gateway: str, workers: int, port: int, logfile: Path) -> Any:
    argv = [sys.executable, "-m", "ops.cli", "serve", "--gateway", gateway, "--lab"]
    argv += ["--listen", f"127.0.0.1:{port}", "--workers", str(workers), "--serve-max-conns"]
    argv += ["100000"]
    err = await asyncio.to_thread(open, logfile, "ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    finally:
        err.close()
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while not (await proc.stdout.readline()).startswith(b"ppf: proxy endpoint"):
            pass
    return proc


async def _until_served(proxy: str, url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            try:
                async with http.get(url, proxy=proxy) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the endpoint never served the site")


async def bench_serve_workers(
    workers: list[int],
    loads: list[Load],
    runs: int = 5,
    kind: str = "http",
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ppf-bench-serve-workers-") as tmp:
        root = Path(tmp)
        certs = nats_certs(root / "certs")
        tls = ssl.create_default_context(cafile=certs["ca"])
        plain, secure = free_port(), free_port()
        site = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SITE, str(plain), str(secure), certs["cert"], certs["key"]
        )
        seen: dict[int, list[dict[str, Any]]] = {n: [] for n in workers}
        try:
            async with upstream(kind) as up, _system(root) as (lg, gateway, _):
                settings = Settings(lab=True, trust=True, trusted_agents=("c-own",))
                token, consumer = enrollment("bench", "consumer")
                _, checker = enrollment("c-own", "checker")
                worked = ProxyWorked(
                    id=fresh_id(), agent="c-own", at=now_ms(), ip="127.0.0.1", port=up.port,
                    proto=up.kind, latency_ms=5, https="yes",
                )  # fmt: skip
                await lg.publish(Configured(id=fresh_id(), agent="admin", at=now_ms(),
                                            settings=settings))  # fmt: skip
                for event in (consumer, checker, worked):
                    await lg.publish(event)
                await _wait_applied(gateway, await lg.head_seq())
                proxy_of = "http://bench:{token}@127.0.0.1:{port}"
                plain_url = f"http://127.0.0.1:{plain}/page"
                secure_url = f"https://127.0.0.1:{secure}/page"
                for run in range(runs):  # A B A B
                    for n in workers:
                        port = free_port()
                        proc = await _endpoint(gateway, n, port, root / f"serve-{n}-{run}.log")
                        proxy = proxy_of.format(token=token, port=port)
                        try:
                            await _until_served(proxy, plain_url)
                            for load in loads:
                                before = _tree_cpu_s(proc.pid)
                                result = await generate(load, proxy, plain_url, secure_url, tls)
                                spent = _tree_cpu_s(proc.pid) - before
                                seen[n].append({
                                    "run": run, "mode": load.mode, "keepalive": load.keepalive,
                                    **result.figures(),
                                    "endpoint_cpu_us_per_request":
                                        round(spent / max(result.sent, 1) * 1e6, 1),
                                })  # fmt: skip
                        finally:
                            proc.terminate()
                            await proc.wait()
        finally:
            site.terminate()
            await site.wait()
    return {"upstream": f"{kind} ({up.program})", **_figures(workers, loads, runs, seen)}


def _figures(
    workers: list[int], loads: list[Load], runs: int, seen: dict[int, list[dict[str, Any]]]
) -> dict[str, Any]:
    def cpu(n: int, run: int) -> float:  # a run's CPU a request over all its loads
        rows = [r for r in seen[n] if r["run"] == run]
        return float(statistics.median(r["endpoint_cpu_us_per_request"] for r in rows))

    first = workers[0]
    medians = {n: statistics.median(cpu(n, run) for run in range(runs)) for n in workers}
    per_core = 1e6 / medians[first] if medians[first] else 0.0
    return {
        "loads": [vars(load) for load in loads],
        "runs": {str(n): rows for n, rows in seen.items()},
        "lost": {str(n): sum(r["lost"] for r in rows) for n, rows in seen.items()},
        "server_errors": {
            str(n): sum(r["server_errors"] for r in rows) for n, rows in seen.items()
        },
        "endpoint_cpu_us_per_request": {str(n): round(m, 1) for n, m in medians.items()},
        "cpu_ratio_by_run": {
            str(n): [round(cpu(n, run) / cpu(first, run), 3) for run in range(runs)]
            for n in workers[1:]
        },
        "cpu_ratio_median": {
            str(n): round(statistics.median(cpu(n, r) / cpu(first, r) for r in range(runs)), 3)
            for n in workers[1:]
        },
        "req_per_s_per_core": round(per_core),
        "cores_for_100k_req_per_s": round(100_000 / per_core, 1) if per_core else None,
    }
