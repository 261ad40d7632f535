"""``ppf bench stats``, its single-events phase: ``/v1/stats`` while a gateway catches
up with a backlog of single events, and right after, against the same observations as
rounds.

Each run, on a server of its own: a gateway up and caught up with the pinned workload's
setup (ops/bench/workload.py), paused (SIGSTOP) while ``observations`` checks over
``proxies`` new proxies are published, as single events (``ProxyWorked`` and
``ProxyFailed`` each a message, as third-party clients and older agents send them) or
as rounds; then let go. ``/v1/stats`` is asked every 20 ms while it works them off and
locates every new address, and ``after`` times more once it has. Runs alternate rounds
and single events (A B A B), so the machine's drift falls on both.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from ops.bench.gateway import _settled
from ops.bench.rounds import publisher
from ops.bench.stats import _gateway_process, _head, _summary, _unlocated, _wait_up
from ops.nats.server import NatsServer, free_port

__all__ = ["bench_singles"]

EVERY_S = 0.02
FORMS = {"rounds": "r", "singles": "s"}


async def _run(
    workdir: Path, form: str, observations: int, proxies: int, after: int, seed: int
) -> dict[str, Any]:
    server = NatsServer(workdir / f"nats-{form}", port=free_port())
    server.start()
    try:
        setup = await asyncio.create_subprocess_exec(
            *publisher([server.url], FORMS[form], 0, proxies, seed)
        )
        if await setup.wait() != 0:
            raise RuntimeError("publishing the workload's setup failed")
        async with (
            aiohttp.ClientSession() as http,
            _gateway_process(server.url, workdir, f"singles-{form}") as (base, gateway),
        ):
            await _wait_up(http, base)
            await _settled(base, quiet_s=1.0, timeout=300)
            gateway.send_signal(signal.SIGSTOP)
            load = await asyncio.create_subprocess_exec(
                *publisher([server.url], FORMS[form], observations, proxies, seed, setup=False),
                stdout=subprocess.DEVNULL,
            )
            if await load.wait() != 0:
                raise RuntimeError("publishing the backlog failed")
            target = await _head(server.url)
            gateway.send_signal(signal.SIGCONT)
            during: list[float] = []
            past: list[float] = []
            t0 = time.monotonic()
            caught_up_s = 0.0
            while len(past) < after and time.monotonic() - t0 < 900:
                t = time.perf_counter()
                async with http.get(base + "/v1/stats") as r:
                    stats = await r.json()
                took = (time.perf_counter() - t) * 1000
                (past if caught_up_s else during).append(took)
                if not caught_up_s and (
                    stats["applied_seq"] == stats["head_seq"] >= target and not _unlocated(stats)
                ):
                    caught_up_s = time.monotonic() - t0
                await asyncio.sleep(max(0.0, EVERY_S - (time.perf_counter() - t)))
    finally:
        server.stop()
    if not caught_up_s:
        raise RuntimeError(f"{form}: the gateway did not catch up in 900 s")
    whole = during + past
    return {
        "caught_up_s": round(caught_up_s, 1),
        "messages": target,
        "while_catching_up": _summary(during),
        "after": _summary(past),
        "p99_ms": _summary(whole)["p99_ms"],
        "max_ms": round(max(whole), 1),
        "over_100_ms": sum(ms > 100 for ms in whole),
    }


async def bench_singles(
    observations: int = 300_000,
    proxies: int = 100_000,
    *,
    runs: int = 5,
    after: int = 500,
    seed: int = 1,
) -> dict[str, Any]:
    """Runs of each form, interleaved; per form the runs' figures and the bar's terms:
    the median of the runs' p99, and the runs with no call over 100 ms."""
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
