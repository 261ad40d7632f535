"""``ppf bench lease`` and ``ppf bench query``: the gateway as agents and users meet it.

Both start a real nats-server and a real ``ppf gateway`` process on loopback; the load
comes from this process, so the gateway has its own interpreter (and GIL), as deployed.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp

from eventlog.client import Log
from events import SourceAdded, url_id
from events.mint import enrollment, fresh_id, now_ms
from events.wire import LeasesReply
from gatewayapi import GatewayApi
from ops.bench.harness import nats_servers
from ops.bench.options import Lease, Query
from ops.bench.workload import ANON, seen_working
from ops.nats.server import free_port
from ops.progress import Progress

__all__ = ["bench_lease", "bench_query"]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _spawn_gateway(url: str, port: int, logfile: Path) -> subprocess.Popen[bytes]:
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ops.cli",
                "gateway",
                "--nats",
                url,
                "--listen",
                f"127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=out,
        )


@contextlib.asynccontextmanager
async def _system(workdir: Path) -> AsyncIterator[tuple[Log, str, subprocess.Popen[bytes]]]:
    """A nats-server and one gateway process; yields (log client, gateway URL, process)."""
    with nats_servers(workdir, "nats") as (server,):
        port = free_port()
        gateway = None
        lg = await Log.connect(server.url, name="ppf-bench")
        try:
            await lg.ensure_stream()
            logfile = workdir / "gateway.log"
            gateway = await asyncio.to_thread(_spawn_gateway, server.url, port, logfile)
            yield lg, f"http://127.0.0.1:{port}", gateway
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(20)
            await lg.close()


async def _wait_applied(base: str, seq: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        api = GatewayApi(http, base)
        while time.monotonic() < deadline:
            stats = await api.stats()
            if stats.ok and stats.object()["applied_seq"] >= seq:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"gateway did not reach seq {seq}")


async def _settled(base: str, quiet_s: float = 3.0, timeout: float = 300) -> None:
    """Until the log's head stands still, all applied, for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    async with aiohttp.ClientSession() as http:
        api = GatewayApi(http, base)
        while time.monotonic() < deadline:
            stats = (await api.stats()).of(dict[str, Any], "stats")
            head = stats["head_seq"]
            if head != last or stats["applied_seq"] != head:
                last, since = head, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            await asyncio.sleep(0.5)
    raise RuntimeError("the log did not settle")


async def bench_lease(lease: Lease, sources: int = 10_000) -> dict[str, Any]:
    """Grants/s and grant latency with ``lease.clients`` agents leasing concurrently.

    Each agent leases ``lease.count`` sources, releases them (done) and leases again;
    only the lease requests are timed. Releasing keeps every agent under the per-agent
    cap.
    """
    clients, seconds, count = lease.clients, lease.seconds, lease.count
    with tempfile.TemporaryDirectory(prefix="ppf-bench-lease-") as tmp:
        async with _system(Path(tmp)) as (lg, base, _):
            tokens = {}
            enroll = []
            for i in range(clients):
                token, event = enrollment(f"b{i:03d}", "worker")
                tokens[f"b{i:03d}"] = token
                enroll.append(event)
            urls = [f"https://bench.example/{i}.txt" for i in range(sources)]
            adds = [
                SourceAdded(id=fresh_id(), agent="admin", at=now_ms(), url=u, url_id=url_id(u))
                for u in urls
            ]
            seqs = await lg.publish_many([*enroll, *adds])
            await _wait_applied(base, seqs[-1])
            latencies: list[float] = []
            granted = 0
            deadline = time.monotonic() + seconds

            async def agent(name: str, token: str) -> None:
                nonlocal granted
                body = {"agent": name, "kind": "source", "count": count, "ttl_s": 600}
                conn = aiohttp.TCPConnector(limit=1)
                async with aiohttp.ClientSession(connector=conn) as http:
                    api = GatewayApi(http, base, token=token)
                    while time.monotonic() < deadline:
                        t = time.perf_counter()
                        answer = await api.lease(body)
                        latencies.append((time.perf_counter() - t) * 1000)
                        leases = answer.of(LeasesReply, "lease").leases
                        granted += len(leases)
                        for g in leases:  # done at once: the next cycle may lease
                            released = await api.release(g.lease, {"outcome": "done"})
                            if not released.ok:
                                raise RuntimeError(f"release answered {released.status}")

            async def show() -> None:
                progress = Progress("leases", None)
                while time.monotonic() < deadline:
                    progress.update(granted)
                    await asyncio.sleep(0.25)
                progress.close()

            t0 = time.perf_counter()
            await asyncio.gather(show(), *(agent(n, t) for n, t in tokens.items()))
            elapsed = time.perf_counter() - t0
    return {
        "clients": clients,
        "count_per_request": count,
        "seconds": round(elapsed, 1),
        "grants": granted,
        "grants_per_s": round(granted / elapsed),
        "requests": len(latencies),
        "latency_p50_ms": round(statistics.median(latencies), 2),
        "latency_p99_ms": round(_pct(latencies, 0.99), 2),
        "latency_max_ms": round(max(latencies), 2),
    }


# GET /v1/proxies with each of these filters (the figures name them by their query).
QUERIES: list[dict[str, str | int]] = [
    {},
    {"proto": "socks5"},
    {"anonymity": "elite", "max_latency_ms": 500},
    {"proto": "http", "sort": "last_seen", "limit": 50},
    {"fresh_s": 3600, "limit": 200},
    {"format": "txt", "proto": "socks4"},
    {"format": "csv", "limit": 100},
    {"country": "ZZ"},  # matches nothing: a full scan
]


async def bench_query(query: Query, rounds: int = 200) -> dict[str, Any]:
    """Latency of filtered queries at ``query.proxies`` alive proxies, and txt of them
    all."""
    proxies = query.proxies
    with tempfile.TemporaryDirectory(prefix="ppf-bench-query-") as tmp:
        async with _system(Path(tmp)) as (lg, base, _):
            events = [
                seen_working(p, 1024 + p % 50000, anonymity=ANON[p % 3]) for p in range(proxies)
            ]
            progress = Progress("publish", len(events))
            seqs = []
            for start in range(0, len(events), 10_000):
                seqs += await lg.publish_many(events[start : start + 10_000])
                progress.update(len(seqs))
            progress.close()
            await _wait_applied(base, seqs[-1])
            # The gateway locates every new address and folds those Located: measure
            # the steady pool, not the minute after a 100,000-proxy burst.
            await _settled(base)
            per_query: dict[str, list[float]] = {}
            async with aiohttp.ClientSession() as http:
                api = GatewayApi(http, base)
                alive = (await api.stats()).object()["proxies"]["alive"]
                for q in QUERIES:  # warm: the first query after the fold builds a snapshot
                    await api.proxies(**q)
                for _ in range(rounds):
                    for q in QUERIES:
                        t = time.perf_counter()
                        answer = await api.proxies(**q)
                        named = urlencode(q) or "all"
                        if not answer.ok:
                            raise RuntimeError(f"{named} answered {answer.status}")
                        per_query.setdefault(named, []).append((time.perf_counter() - t) * 1000)
                txt_ms = []
                for _ in range(10):
                    t = time.perf_counter()
                    body = (await api.proxies(format="txt", limit=0)).body
                    txt_ms.append((time.perf_counter() - t) * 1000)
                lines = body.count(b"\n")
    every = [x for xs in per_query.values() for x in xs]
    return {
        "alive_proxies": alive,
        "requests": len(every),
        "latency_p50_ms": round(statistics.median(every), 2),
        "latency_p99_ms": round(_pct(every, 0.99), 2),
        "per_query_p99_ms": {q: round(_pct(xs, 0.99), 2) for q, xs in per_query.items()},
        "txt_all_lines": lines,
        "txt_all_ms_median": round(statistics.median(txt_ms), 1),
        "txt_all_ms_max": round(max(txt_ms), 1),
    }
