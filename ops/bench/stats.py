"""``ppf bench stats``: what ``/v1/stats`` costs at a large pool, and what it costs the fold.

Against one real nats-server and real ``ppf gateway`` processes (each with its own
interpreter, as deployed), all on loopback:

1. a pool of ``proxies`` distinct proxies is published once (``ProxyWorked`` each); a
   first gateway locates them (its ``Located`` go to the log, so the gateways after it
   have nothing to look up while they are measured); then a backlog of ``backlog``
   re-confirmations;
2. **fold rate**, interleaved A B A B: a fresh gateway folds the whole log from sequence 1;
   the rate is taken over the backlog part (after the pool is built). In A the bench
   asks ``/healthz`` every 100 ms (to see ``applied_seq``), in B ``/v1/stats`` every
   100 ms: the difference is what a polling dashboard costs the fold;
3. **latency under load**: one gateway that holds the pool; a child process publishes
   ``rate`` events/s for ``seconds`` while the bench asks ``/v1/stats`` every 100 ms, then
   again while it asks ``/v1/proxies?limit=100`` every 100 ms. The fold's applied rate in
   each window is reported, so the load it ran under is a measured figure too;
4. **a backlog**, on a server of its own: a gateway that is up and caught up, then the
   pinned workload (ops/bench/workload.py) as rounds, ``backlog_observations`` of them
   over ``proxies`` new proxies, published as fast as the stream takes them, and the
   gateway's own ``Located`` for every new address. Until it has applied them all and
   located every address, the bench asks ``/v1/stats`` and ``POST /v1/leases`` (one
   source, as an enrolled worker) every 100 ms.

The single-events phase is ops/bench/singles.py (``ppf bench stats`` runs it after).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from eventlog.client import Log
from events import AgentEnrolled, Leased, ProxyWorked, encode, subject_for, token_sha256
from events.mint import fresh_id, now_ms
from events.wire import LeasesReply
from gatewayapi import Answer, GatewayApi, GatewayError
from ops.bench.gateway import _pct, _settled, _spawn_gateway
from ops.bench.harness import ensure_stream, head_seq, nats_servers, publish_workload
from ops.bench.options import Stats
from ops.bench.streams import Workload, publisher
from ops.bench.workload import seen_working
from ops.nats.server import free_port
from ops.progress import Progress

__all__ = ["bench_stats"]

POLL_S = 0.1
AFTER_S = 10.0  # asked after each catch-up for this long


def _worked(n: int) -> ProxyWorked:
    return seen_working(n, 8080 + n % 3)


async def _publish(url: str, first: int, count: int, pool: int, *, rate: float = 0.0) -> int:
    """Confirmations of proxies ``first % pool`` onwards, as fast as the stream takes them
    or at ``rate`` a second; returns the stream head after."""
    lg = await Log.connect(url, name="ppf-bench-stats-publisher")
    start_head = await lg.head_seq()
    t0 = time.monotonic()
    for i in range(count):
        ev = _worked((first + i) % pool)
        await lg.nc.publish(subject_for(ev), encode(ev), headers={"Nats-Msg-Id": ev.id})
        if rate and i % 100 == 99:
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        elif not rate and i % 20_000 == 19_999:
            await lg.nc.flush()
            while await lg.head_seq() < start_head + i - 40_000:
                await asyncio.sleep(0.01)
    await lg.nc.flush()
    deadline = time.monotonic() + 120
    while (head := await lg.head_seq()) < start_head + count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await lg.close()
    return head


def _publisher(url: str, first: int, count: int, pool: int, rate: float) -> subprocess.Popen[bytes]:
    """The steady load comes from its own process, so it does not share our loop."""
    args = [sys.executable, "-m", "ops.bench.stats", url, str(first), str(count), str(pool)]
    return subprocess.Popen([*args, str(rate)], stdout=subprocess.DEVNULL)


@contextlib.asynccontextmanager
async def _gateway(url: str, workdir: Path, name: str) -> AsyncIterator[str]:
    async with _gateway_process(url, workdir, name) as (base, _):
        yield base


@contextlib.asynccontextmanager
async def _gateway_process(
    url: str, workdir: Path, name: str
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = await asyncio.to_thread(_spawn_gateway, url, port, workdir / f"{name}.log")
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused one too
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


async def _applied(api: GatewayApi, ask: Ask = GatewayApi.healthz) -> int:
    """The fold's applied sequence, as ``ask`` (/healthz, or /v1/stats) says it."""
    return int((await ask(api)).of(dict[str, Any], "applied")["applied_seq"])


async def _wait_up(api: GatewayApi, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(GatewayError):
            await _applied(api)
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"gateway {api.base} did not answer")


async def _fold_rate(
    url: str, workdir: Path, pool_head: int, head: int, poll: Ask, run: int
) -> float:
    """Events/s the gateway's fold applies between ``pool_head`` and ``head``, asking
    ``poll`` (/healthz or /v1/stats)."""
    async with aiohttp.ClientSession() as http, _gateway(url, workdir, f"fold-{run}") as base:
        api = GatewayApi(http, base)
        await _wait_up(api)
        marks: list[tuple[float, int]] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            seq = await _applied(api, poll)
            marks.append((time.monotonic(), seq))
            if seq >= head:
                break
            await asyncio.sleep(POLL_S)
        else:
            raise RuntimeError(f"fold did not reach {head}")
    # From the last sample before the backlog to the first at its end.
    start = max((m for m in marks if m[1] <= pool_head), default=marks[0])
    end = next(m for m in marks if m[1] >= head)
    return (end[1] - start[1]) / max(end[0] - start[0], 1e-9)


# A call of the gateway's API, timed.
Ask = Callable[[GatewayApi], Awaitable[Answer]]


def _first_hundred(api: GatewayApi) -> Awaitable[Answer]:
    return api.proxies(limit=100)


async def _latency(api: GatewayApi, ask: Ask, seconds: float) -> tuple[list[float], float]:
    """Latencies (ms) of ``ask`` every 100 ms, and the fold's applied rate meanwhile."""
    first = await _applied(api)
    t0 = time.monotonic()
    latencies = []
    while time.monotonic() - t0 < seconds:
        t = time.perf_counter()
        answer = await ask(api)
        if not answer.ok:
            raise RuntimeError(f"{ask} answered {answer.status}")
        latencies.append((time.perf_counter() - t) * 1000)
        await asyncio.sleep(max(0.0, POLL_S - (time.perf_counter() - t)))
    rate = (await _applied(api) - first) / (time.monotonic() - t0)
    return latencies, rate


def _summary(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(_pct(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
    }


async def _backlog(
    workdir: Path, observations: int, proxies: int, seed: int, *, burst: bool, run: int = 0
) -> dict[str, Any]:
    """Phase 4: /v1/stats and a lease grant while the gateway works off a backlog. Not
    ``burst``: the gateway is paused (SIGSTOP) while the backlog is published, then let
    go: it works it off from the log as after a stall, a partition or a restart. With
    ``burst``, the backlog is published while the gateway runs, as fast as the stream
    takes it: the publisher and nats-server then take the machine's two cores from the
    gateway, and every lease waits for JetStream's ack behind the burst."""
    with nats_servers(workdir, f"nats-backlog-{burst}-{run}") as (server,):
        # The setup alone: enrolments, settings, sources.
        await publish_workload(Workload([server.url], "r", 0, proxies, seed))
        token = f"bench-{fresh_id()}"
        lg = await Log.connect(server.url)
        enrolled = AgentEnrolled(
            id=fresh_id(), agent="admin", at=now_ms(), name="wbench", role="worker",
            token_sha256=token_sha256(token),
        )  # fmt: skip
        await lg.publish(enrolled)
        await lg.close()
        async with (
            aiohttp.ClientSession() as http,
            _gateway_process(server.url, workdir, f"backlog-{burst}-{run}") as (base, gateway),
        ):
            api = GatewayApi(http, base, token=token)
            await _wait_up(api)
            await _settled(base, quiet_s=1.0, timeout=300)
            if not burst:
                gateway.send_signal(signal.SIGSTOP)
            load = await asyncio.create_subprocess_exec(
                *publisher(Workload([server.url], "r", observations, proxies, seed, setup=False)),
                stdout=subprocess.DEVNULL,
            )  # not waited for: the gateway is asked while it runs
            published_s = 0.0  # from the gateway's go to the publisher's end
            target = 0  # the log's head once the backlog is in it
            if not burst:
                await load.wait()
                target = await head_seq(server.url)
                gateway.send_signal(signal.SIGCONT)  # its cached head is the old one yet
            probe_ms: list[float] = []
            probe = asyncio.create_task(_probe_claims(server.url, probe_ms))
            stats_ms: list[float] = []
            lease_ms: list[float] = []
            statuses: dict[int, int] = {}
            granted = 0
            lag = 0
            body = {"agent": "wbench", "kind": "source", "count": 1, "ttl_s": 600}
            t0 = time.monotonic()
            while time.monotonic() - t0 < 900:
                t = time.perf_counter()
                stats = (await api.stats()).object()
                stats_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                answer = await api.lease(body)
                statuses[answer.status] = statuses.get(answer.status, 0) + 1
                if answer.ok:  # a fast answer that grants nothing is no grant
                    granted += len(answer.of(LeasesReply, "lease").leases)
                lease_ms.append((time.perf_counter() - t) * 1000)
                lag = max(lag, stats["head_seq"] - stats["applied_seq"])
                published = load.returncode is not None
                if published and not published_s:
                    published_s = time.monotonic() - t0
                if published and load.returncode != 0:
                    raise RuntimeError("publishing the backlog failed")
                if published and not target:
                    target = await head_seq(server.url)
                caught_up = stats["applied_seq"] == stats["head_seq"] >= target and not _unlocated(
                    stats
                )
                if published and caught_up:
                    break
                left = max(0.0, POLL_S - (time.perf_counter() - t))
                if published:
                    await asyncio.sleep(left)
                else:
                    with contextlib.suppress(TimeoutError):  # and notice the publisher's end
                        async with asyncio.timeout(left):
                            await load.wait()
            worked_off_s = time.monotonic() - t0
            after_stats, after_lease = await _after(api, body)
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            if load.returncode is None:
                load.terminate()
            await load.wait()
    return {
        "observations": observations,
        "new_proxies": proxies,
        "published_s": round(published_s, 1),  # 0.0: all published before the go
        "worked_off_s": round(worked_off_s, 1),
        "max_lag_messages": lag,
        "stats": _summary(stats_ms),
        "lease": {**_summary(lease_ms), "statuses": statuses, "granted": granted},
        # The AFTER_S once it caught up: whatever the checkpoint and the view are doing.
        "after": {"stats": _summary(after_stats), "lease": _summary(after_lease)},
        # The same claim as a grant's, from this process, not the gateway's: what
        # JetStream's ack of a compare-and-set costs meanwhile, the gateway aside.
        "claim_ack": _summary(probe_ms),
    }


async def stats_then_lease(api: GatewayApi, body: dict[str, Any]) -> tuple[float, float, int]:
    """/v1/stats asked, then a lease: each one's time (ms), and the lease's status."""
    t = time.perf_counter()
    await api.stats()
    stats_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    status = (await api.lease(body)).status
    return stats_ms, (time.perf_counter() - t) * 1000, status


async def _after(api: GatewayApi, body: dict[str, Any]) -> tuple[list[float], list[float]]:
    """/v1/stats and a lease grant every ``POLL_S`` for ``AFTER_S``: their times (ms)."""
    stats_ms: list[float] = []
    lease_ms: list[float] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < AFTER_S:
        t = time.perf_counter()
        stats, lease, _ = await stats_then_lease(api, body)
        stats_ms.append(stats)
        lease_ms.append(lease)
        await asyncio.sleep(max(0.0, POLL_S - (time.perf_counter() - t)))
    return stats_ms, lease_ms


async def _probe_claims(url: str, samples: list[float]) -> None:
    """A claim on a new source's lease subject (expected last subject sequence 0, as a
    grant on a free target publishes) every ``POLL_S``, each ack's wait in ``samples``."""
    lg = await Log.connect(url, name="ppf-bench-claims")
    try:
        for i in itertools.count():
            lease = fresh_id()
            claim = Leased(
                id=lease, agent="bench-probe", at=now_ms(), lease=lease, kind="source",
                target=f"probe-{i}", ttl_s=60,
            )  # fmt: skip
            t = time.perf_counter()
            await lg.publish(claim, expected_last_subject_seq=0)
            samples.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(POLL_S)
    finally:
        await lg.close()


def _unlocated(stats: dict[str, Any]) -> int:
    """Addresses the gateway has still to locate, as /v1/stats reports them."""
    return int(stats.get("geo", {}).get("unlocated", 0))


async def bench_stats(
    stats: Stats, *, backlog: int = 1_000_000, runs: int = 3, seed: int = 1
) -> dict[str, Any]:
    """``backlog`` events folded in ``runs`` runs polling /healthz and /v1/stats in turns,
    then the latency under load, then ``stats.backlog_runs`` backlogs caught up with."""
    proxies, seconds, rate = stats.proxies, stats.seconds, stats.rate
    backlog_observations, backlog_runs = stats.backlog_rounds, stats.backlog_runs
    with tempfile.TemporaryDirectory(prefix="ppf-bench-stats-") as tmp:
        workdir = Path(tmp)
        with nats_servers(workdir, "nats") as (server,):
            await ensure_stream(server.url)
            progress = Progress("publish", None)
            await _publish(server.url, 0, proxies, proxies)
            async with _gateway(server.url, workdir, "locate") as base:
                async with aiohttp.ClientSession() as http:
                    await _wait_up(GatewayApi(http, base))
                await _settled(base, timeout=1800)
            pool_head = await head_seq(server.url)
            progress.update(pool_head)
            head = await _publish(server.url, 0, backlog, proxies)
            progress.close()
            rates: dict[str, list[float]] = {"healthz": [], "stats": []}
            for run in range(runs):  # A B A B: the machine's drift falls on both
                for poll, ask in (("healthz", GatewayApi.healthz), ("stats", GatewayApi.stats)):
                    r = await _fold_rate(server.url, workdir, pool_head, head, ask, run)
                    rates[poll].append(r)
            async with (
                aiohttp.ClientSession() as http,
                _gateway(server.url, workdir, "latency") as base,
            ):
                api = GatewayApi(http, base)
                await _wait_up(api)
                await _settled(base, timeout=1800)
                count = int(rate * seconds * 2.5)  # outlasts both windows below
                load = _publisher(server.url, 0, count, proxies, float(rate))
                try:
                    await asyncio.sleep(2.0)  # the load settles
                    stats_ms, stats_rate = await _latency(api, GatewayApi.stats, seconds)
                    page = _first_hundred
                    proxies_ms, proxies_rate = await _latency(api, page, seconds)
                finally:
                    load.terminate()
                    await asyncio.to_thread(load.wait, 30)
        worked_off: list[dict[str, Any]] = []
        burst = None
        if backlog_observations:
            for run in range(backlog_runs):
                worked_off.append(
                    await _backlog(
                        workdir, backlog_observations, proxies, seed, burst=False, run=run
                    )
                )
            burst = await _backlog(workdir, backlog_observations, proxies, seed, burst=True)
        after = [ms for run in worked_off for ms in (run["after"]["stats"], run["after"]["lease"])]
    healthz, polled = statistics.median(rates["healthz"]), statistics.median(rates["stats"])
    return {
        "proxies": proxies,
        "backlog_events": backlog,
        "fold_events_per_s_polling_healthz": [round(r) for r in rates["healthz"]],
        "fold_events_per_s_polling_stats": [round(r) for r in rates["stats"]],
        "fold_cost_of_stats_polling_pct": round(100 * (healthz - polled) / healthz, 1),
        "load_events_per_s_asked": rate,
        "stats": {**_summary(stats_ms), "fold_events_per_s": round(stats_rate)},
        "proxies_limit_100": {**_summary(proxies_ms), "fold_events_per_s": round(proxies_rate)},
        "backlog": worked_off[0] if len(worked_off) == 1 else worked_off or None,
        "burst": burst,
        # Over every backlog run's AFTER_S once caught up, /v1/stats and leases alike.
        "after_catch_ups_p99_ms_max": max((a["p99_ms"] for a in after), default=None),
        "after_catch_ups_max_ms": max((a["max_ms"] for a in after), default=None),
    }


if __name__ == "__main__" and len(sys.argv) == 6:
    _, url, first, count, pool, per_s = sys.argv
    asyncio.run(_publish(url, int(first), int(count), int(pool), rate=float(per_s)))
