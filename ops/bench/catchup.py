"""What a fresh gateway delivers catching up with a log (``ppf bench fold``'s headline):
wall clock from its fold's start to the served pool view holding the stream's last
message, as ``ppf gateway`` runs them (the fold in memory, its checkpoint writer
keeping the digest, the view following the fold), in this process."""

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from eventlog.client import Log
from gateway.views import FOLLOW_S, PoolViewKeeper
from ops.bench.harness import Workload, checkout, head_seq, nats_servers, publish_workload
from ops.bench.options import Fold
from ops.bench.streams import publish_synthetic
from ops.collector import collect_young
from projections.live import FoldService

__all__ = ["bench_catch_up_versus", "gateway_catch_up"]


async def gateway_catch_up(
    url: str,
    head: int,
    burst: Callable[[], Awaitable[int]] | None = None,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Seconds to the fold's last message and to the view holding it, and the CPU
    seconds of this process meanwhile (the checkpoint writer's child not counted).
    ``burst``: publishes more once it caught up (returning the new head): the seconds
    from the fold's last message of it to the view holding it."""
    lg = await Log.connect(url, name="ppf-bench-gateway")
    fold = FoldService(lg, dlq=False, between=collect_young)  # as ops/cli/services.py
    keeper = PoolViewKeeper(foreground=fold.foreground, catching_up=fold.catching_up)
    fold.cut_waits_for = keeper.wanted  # as gateway/app.py
    cpu, started = time.process_time(), time.perf_counter()
    await fold.start()
    follower = asyncio.create_task(keeper.follow(lambda: fold.state))
    folded_s = 0.0
    try:
        while (view := keeper.current) is None or view.seq < head:
            if not folded_s and fold.state.last_seq >= head:
                folded_s = time.perf_counter() - started
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the gateway did not catch up with {head} in {timeout_s} s")
            await asyncio.sleep(FOLLOW_S / 5)
        served_s = time.perf_counter() - started
        cpu = time.process_time() - cpu
        after_burst = await _burst(fold, keeper, burst) if burst is not None else None
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await fold.stop()
        await lg.close()
    return {
        "view_after_burst": after_burst,
        "seconds": round(served_s, 2),
        "fold_seconds": round(folded_s or served_s, 2),
        "view_after_fold_s": round(served_s - (folded_s or served_s), 2),
        "cpu_seconds": round(cpu, 2),
    }


async def _burst(
    fold: FoldService, keeper: PoolViewKeeper, burst: Callable[[], Awaitable[int]]
) -> dict[str, Any]:
    """The seconds from the fold's last message of ``burst`` to the view holding it,
    and the rows that view holds."""
    await asyncio.sleep(2.0)  # a gateway serving, its view whole
    head = await burst()
    while fold.state.last_seq < head:
        await asyncio.sleep(0.001)
    folded = time.perf_counter()
    while (view := keeper.current) is None or view.seq < head:
        await asyncio.sleep(0.001)
    return {"seconds": round(time.perf_counter() - folded, 2), "served": len(view.by_latency)}


# Runs inside either tree (cwd, first on the path): a fresh gateway's catch-up with the
# stream at URL up to HEAD, its figures as one JSON line: the tree's own
# ``gateway_catch_up`` where it has one (as ``ppf gateway`` runs its parts); a tree from
# before it, its fold and view as they were, the view asked for as queries ask (every
# 50 ms) where it did not follow the fold.
_CHILD = r"""
import asyncio, json, sys, time
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
from eventlog.client import Log
from projections.live import FoldService
from gateway.views import PoolViewKeeper

async def main(url, head):
    try:
        from ops.bench.catchup import gateway_catch_up
    except ImportError:
        pass
    else:
        print(json.dumps(await gateway_catch_up(url, head)))
        return
    lg = await Log.connect(url)
    fold = FoldService(lg, dlq=False)
    try:
        keeper = PoolViewKeeper(foreground=fold.foreground, catching_up=fold.catching_up)
    except (TypeError, AttributeError):
        keeper = PoolViewKeeper(foreground=fold.foreground)
    started, cpu = time.perf_counter(), time.process_time()
    await fold.start()
    follow = getattr(keeper, "follow", None)
    task = asyncio.create_task(follow(lambda: fold.state)) if follow else None
    while keeper.current is None or keeper.current.seq < head:
        if task is None:
            await keeper.view(fold.state)
        await asyncio.sleep(0.01 if task else 0.05)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if task:
        task.cancel()
    await fold.stop()
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu}))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def bench_catch_up_versus(fold: Fold) -> dict[str, Any]:
    """A fresh gateway's catch-up with this tree and with ``fold.versus`` (``git worktree
    add DIR REV``, its C built), in turns (A B A B, which starts first alternating), on
    one stream of ``fold.events`` observations published once: observations a second,
    medians and each run's ratio; the seconds from the fold's end to the view holding
    it, where a tree's catch-up says them."""
    assert fold.versus is not None
    observations, proxies, seed, runs = fold.events, fold.proxies, fold.seed, fold.runs
    rounds = not fold.singles
    trees = {"old": checkout(fold.versus), "new": Path(__file__).resolve().parents[2]}
    said_by: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with (
        tempfile.TemporaryDirectory(prefix="ppf-bench-catch-up-") as tmp,
        nats_servers(Path(tmp), "nats") as (server,),
    ):
        if rounds:
            await publish_workload(Workload([server.url], "r", observations, proxies, seed))
            head = await head_seq(server.url)
        else:
            head = observations = await publish_synthetic(server.url, observations, proxies, seed)
        for run in range(runs):
            for name in trees if run % 2 == 0 else reversed(trees):
                said = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-c", _CHILD, server.url, str(head)],
                    cwd=trees[name],
                    env={**os.environ, "PYTHONPATH": str(trees[name])},
                    capture_output=True,
                    check=True,
                )
                said_by[name].append(json.loads(said.stdout.splitlines()[-1]))
    rate = {name: [observations / x["seconds"] for x in said_by[name]] for name in trees}
    after = {
        name: [x["view_after_fold_s"] for x in xs if "view_after_fold_s" in x]
        for name, xs in said_by.items()
    }
    return {
        "form": "rounds" if rounds else "singles",
        "observations": observations,
        "old": str(trees["old"]),
        "old_observations_per_s": [round(r) for r in rate["old"]],
        "new_observations_per_s": [round(r) for r in rate["new"]],
        "new_vs_old": round(statistics.median(rate["new"]) / statistics.median(rate["old"]), 2),
        "new_vs_old_by_run": [
            round(n / o, 2) for n, o in zip(rate["new"], rate["old"], strict=True)
        ],
        "old_view_after_fold_s": after["old"],
        "new_view_after_fold_s": after["new"],
    }
