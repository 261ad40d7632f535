"""``ppf bench snapshot``: how soon a new gateway is ready from a snapshot, against from
sequence 1, on the same log in the same run.

Against one real nats-server, all on loopback:

1. the pinned workload (ops/bench/workload.py) as rounds, ``observations`` of them over
   ``proxies`` proxies, published from a child process; a first gateway locates every
   address (its ``Located`` go to the log, so the gateways measured have nothing to
   look up);
2. ``ppf snapshot`` folds the log from sequence 1 and takes a snapshot at its head (the
   time it took and the snapshot's size are reported);
3. interleaved A B A B: a new ``ppf gateway`` process (each its own interpreter, as
   deployed) from the snapshot, then one with ``--no-snapshots``, each timed from its
   spawn until ``/readyz`` answers 200 (caught up with the head).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from eventlog.client import Log
from ops.bench.gateway import _settled
from ops.bench.harness import Workload, ensure_stream, nats_servers, publish_workload
from ops.bench.options import Snapshot
from ops.nats.server import free_port

__all__ = ["bench_snapshot"]


def _gateway(
    url: str, port: int, logfile: Path, *extra: str, tree: Path | None = None
) -> subprocess.Popen[bytes]:
    """A ``ppf gateway`` process; ``tree``: another checkout's, its code first."""
    cmd = [sys.executable, "-m", "ops.cli", "gateway", "--nats", url]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            [*cmd, "--listen", f"127.0.0.1:{port}", *extra],
            stdout=out,
            stderr=out,
            cwd=tree,
            env=env,
        )


async def _ready_at(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until the gateway on ``port`` answers /readyz 200."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited {proc.returncode}")
            await asyncio.sleep(0.05)
    raise RuntimeError(f"gateway not ready within {timeout} s")


async def _ready_s(url: str, workdir: Path, name: str, *extra: str, timeout: float) -> float:
    """Seconds from spawning a gateway until its /readyz answers 200."""
    port = free_port()
    t0 = time.monotonic()
    proc = await asyncio.to_thread(_gateway, url, port, workdir / f"{name}.log", *extra)
    try:
        await _ready_at(port, proc, timeout)
        return time.monotonic() - t0
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 60)


async def bench_snapshot(snap: Snapshot, seed: int = 1) -> dict[str, Any]:
    observations, proxies, runs = snap.observations, snap.proxies, snap.runs
    with tempfile.TemporaryDirectory(prefix="ppf-bench-snapshot-") as tmp:
        workdir = Path(tmp)
        with nats_servers(workdir, "nats") as (server,):
            await ensure_stream(server.url)
            await publish_workload(Workload([server.url], "r", observations, proxies, seed))
            port = free_port()
            locator = await asyncio.to_thread(
                _gateway, server.url, port, workdir / "locate.log", "--no-snapshots"
            )
            try:
                await _ready_at(port, locator, timeout=3600)  # caught up
                await _settled(f"http://127.0.0.1:{port}", quiet_s=3.0, timeout=3600)
            finally:
                locator.terminate()
                await asyncio.to_thread(locator.wait, 60)
            lg = await Log.connect(server.url)
            span = await lg.snapshots.span()
            t0 = time.monotonic()
            taken = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "ops.cli", "snapshot", "--nats", server.url],
                capture_output=True,
                timeout=3600,
            )
            snapshot_s = time.monotonic() - t0
            if taken.returncode != 0:
                raise RuntimeError(f"ppf snapshot failed: {taken.stderr.decode()[-500:]}")
            seq = int(json.loads(taken.stdout.splitlines()[-1])["seq"])
            size = len(await lg.snapshots.get(seq))
            await lg.close()
            ready: dict[str, list[float]] = {"snapshot": [], "seq1": []}
            for run in range(runs):  # A B A B
                ready["snapshot"].append(
                    await _ready_s(server.url, workdir, f"from-snapshot-{run}", timeout=600)
                )
                ready["seq1"].append(
                    await _ready_s(
                        server.url, workdir, f"from-seq1-{run}", "--no-snapshots", timeout=3600
                    )
                )
    a, b = statistics.median(ready["snapshot"]), statistics.median(ready["seq1"])
    return {
        "observations": observations,
        "proxies": proxies,
        "log_messages": span.last_seq,
        "log_bytes": span.bytes,
        "snapshot_seq": seq,
        "snapshot_bytes": size,
        "snapshot_taken_s": round(snapshot_s, 1),
        "ready_from_snapshot_s": [round(x, 2) for x in ready["snapshot"]],
        "ready_from_seq1_s": [round(x, 2) for x in ready["seq1"]],
        "ratio": round(a / b, 3),
    }
