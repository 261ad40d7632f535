"""``ppf bench stats``, its single-events phase: ``/v1/stats`` while ``ppf up`` catches
up with a backlog of single events, and right after, against the same observations as
rounds.

Each run, a ``ppf up --no-agents`` of its own (its fold persisting, its endpoint's feed
polling the pool, its locator), caught up with the pinned workload's setup
(ops/bench/workload.py: 25 agents, trust on; its ids carry the workload's fixed dates,
so its settings keep the count window, not ``ppf up``'s window in log time); paused
(SIGSTOP) while ``observations`` checks over ``proxies`` new proxies are published, as
single events (``ProxyWorked`` and ``ProxyFailed`` each a message, as third-party
clients and older agents send them) or as rounds; then let go. ``/v1/stats`` is asked
every 20 ms while it works them off and locates every new address, and ``after`` times
more once it has. Runs alternate rounds and single events (A B A B), so the machine's
drift falls on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from gatewayapi import GatewayApi
from ops.bench.gateway import _settled
from ops.bench.harness import Workload, head_seq, publish_workload
from ops.bench.options import Stats
from ops.bench.stats import _summary, _unlocated, _wait_up
from ops.nats.server import free_port, with_credentials

__all__ = ["bench_singles"]

EVERY_S = 0.02
FORMS = {"rounds": "r", "singles": "s"}


@contextlib.asynccontextmanager
async def _up(workdir: Path) -> AsyncIterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """``ppf up --no-agents`` on loopback ports of its own: (API base, service NATS URL,
    process). As users run it: the fold persisting to DuckDB, the rotating endpoint's
    feed polling the whole pool, the locator."""
    data = workdir / "data"
    http, nats = free_port(), free_port()
    argv = [
        sys.executable, "-m", "ops.cli", "up", "--no-agents", "--data", str(data),
        "--listen", f"127.0.0.1:{http}", "--nats-listen", f"127.0.0.1:{nats}",
        "--serve-listen", f"127.0.0.1:{free_port()}",
        "--judge-tls-listen", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    proc = await asyncio.to_thread(_spawn, argv, workdir / "up.log")
    base = f"http://127.0.0.1:{http}"
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_up(GatewayApi(session, base))
        yield base, with_credentials(f"nats://127.0.0.1:{nats}", data / "nats"), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused one too
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(proc.wait, 60)


def _spawn(argv: list[str], logfile: Path) -> subprocess.Popen[bytes]:
    with open(logfile, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out)


async def _run(
    workdir: Path, form: str, observations: int, proxies: int, after: int, seed: int
) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, _up(workdir) as (base, url, up):
        await publish_workload(Workload([url], FORMS[form], 0, proxies, seed))
        await _settled(base, quiet_s=1.0, timeout=300)
        up.send_signal(signal.SIGSTOP)
        await publish_workload(
            Workload([url], FORMS[form], observations, proxies, seed, setup=False)
        )
        target = await head_seq(url)
        up.send_signal(signal.SIGCONT)
        during: list[float] = []
        past: list[float] = []
        t0 = time.monotonic()
        caught_up_s = 0.0
        while len(past) < after and time.monotonic() - t0 < 900:
            t = time.perf_counter()
            stats = (await GatewayApi(http, base).stats()).object()
            took = (time.perf_counter() - t) * 1000
            (past if caught_up_s else during).append(took)
            if not caught_up_s and (
                stats["applied_seq"] == stats["head_seq"] >= target and not _unlocated(stats)
            ):
                caught_up_s = time.monotonic() - t0
            await asyncio.sleep(max(0.0, EVERY_S - (time.perf_counter() - t)))
    if not caught_up_s:
        raise RuntimeError(f"{form}: ppf up did not catch up in 900 s")
    whole = during + past
    return {
        "caught_up_s": round(caught_up_s, 1),
        "messages": target,
        "known": stats["proxies"]["known"],
        "while_catching_up": _summary(during),
        "after": _summary(past),
        "p99_ms": _summary(whole)["p99_ms"],
        "max_ms": round(max(whole), 1),
        "over_100_ms": sum(ms > 100 for ms in whole),
    }


async def bench_singles(stats: Stats, *, after: int = 500, seed: int = 1) -> dict[str, Any]:
    """``stats.singles`` observations over ``stats.proxies`` new proxies, as single events
    and as rounds, ``stats.singles_runs`` runs of each form, interleaved; per form the
    runs' figures and the bar's terms: the median of the runs' p99, and the runs with no
    call over 100 ms."""
    observations, proxies, runs = stats.singles, stats.proxies, stats.singles_runs
    by_form: dict[str, list[dict[str, Any]]] = {form: [] for form in FORMS}
    with tempfile.TemporaryDirectory(prefix="ppf-bench-singles-") as tmp:
        for run in range(runs):
            for form in FORMS:
                workdir = Path(tmp) / f"{form}-{run}"
                workdir.mkdir()
                by_form[form].append(await _run(workdir, form, observations, proxies, after, seed))
    out: dict[str, Any] = {"observations": observations, "new_proxies": proxies, "runs": runs}
    for form, each in by_form.items():
        out[form] = {
            "p99_ms_median": round(statistics.median(f["p99_ms"] for f in each), 2),
            "runs_without_a_call_over_100_ms": sum(not f["over_100_ms"] for f in each),
            "runs": each,
        }
    return out
