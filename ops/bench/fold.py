"""``ppf bench fold``: what a gateway catching up delivers, against the consume ceiling
and the design ppf replaces, same run.

Phases, all against one real nats-server on loopback:
1. publish N synthetic events (in a child process, so its memory is not ours);
2. ceiling: nats-py ordered push consumer with a callback that does nothing;
3. lean path: the firehose reader with no decoding (the raw read);
4. a fresh gateway: its fold and the pool view following it, from the first message
   read to the served view holding the last, wall clock (ops/bench/catchup.py);
5. ppf's replay: firehose + decode + reducers + DuckDB checkpoints into a fresh file;
6. baseline: the design ppf replaces, a coordinator that upserts every report into
   SQLite one row at a time (``INSERT OR REPLACE`` per report), over the same events.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eventlog.client import Log
from eventlog.stream import Firehose, native_frames
from events import Fetched, ProxiesChecked, ProxyFailed, ProxyWorked, decode
from events.batches import expand
from ops.bench.catchup import gateway_catch_up
from ops.bench.compare import median_ci, pct_by_run, pct_of_medians
from ops.bench.harness import Workload, head_seq, nats_servers, publish_workload
from ops.bench.options import Fold
from ops.bench.streams import publish_synthetic, synthetic_in_lockstep
from ops.progress import Progress
from projections import Store, digest
from projections.folder import Checkpointer, Folder
from projections.replay import replay
from reducers import State

__all__ = ["bench_fold", "bench_located"]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _ceiling_nats_py(url: str, head: int) -> float:
    lg = await Log.connect(url, name="ppf-bench-ceiling")
    done = asyncio.Event()
    count = 0

    async def cb(msg: Any) -> None:
        nonlocal count
        count += 1
        if count >= head:
            done.set()

    t = time.perf_counter()
    sub = await lg.js.subscribe("ppf.>", cb=cb, ordered_consumer=True)
    async with asyncio.timeout(600):
        await done.wait()
    elapsed = time.perf_counter() - t
    await sub.unsubscribe()
    await lg.close()
    return head / elapsed


async def _firehose_raw(url: str, head: int) -> float:
    t = time.perf_counter()
    n = 0
    async for batch in Firehose(url).batches(until=head):
        n += len(batch)
    return n / (time.perf_counter() - t)


async def _sqlite_baseline(url: str, head: int, budget_s: float, workdir: Path) -> dict[str, Any]:
    """The old master: one ``INSERT OR REPLACE`` per report, committed per batch."""
    con = sqlite3.connect(workdir / "baseline.sqlite")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(
        "CREATE TABLE proxies (ip TEXT, port INTEGER, proto TEXT, last_seen INTEGER, "
        "latency REAL, fails INTEGER, PRIMARY KEY (ip, port))"
    )
    con.execute("CREATE TABLE sources (url_id TEXT PRIMARY KEY, check_time INTEGER, ok INTEGER)")
    t = time.perf_counter()
    n = 0
    async for batch in Firehose(url).batches(until=head):
        for _seq, ts, _subject, payload in batch:
            event = decode(payload)
            # The old master took a report a request: a round is its reports.
            for ev in expand(event) if isinstance(event, ProxiesChecked) else (event,):
                n += _upsert(con, ev, ts)
        con.commit()
        if time.perf_counter() - t > budget_s:
            break
    elapsed = time.perf_counter() - t
    con.close()
    return {"reports": n, "reports_per_s": n / elapsed}


def _upsert(con: sqlite3.Connection, ev: Any, ts: int) -> int:
    """One report into the old master's tables; 1 when it was a report."""
    if isinstance(ev, ProxyWorked):
        con.execute(
            "INSERT OR REPLACE INTO proxies VALUES (?, ?, ?, ?, ?, 0)",
            (ev.ip, ev.port, ev.proto, ts, ev.latency_ms),
        )
    elif isinstance(ev, ProxyFailed):
        con.execute(
            "INSERT OR REPLACE INTO proxies (ip, port, proto, last_seen, fails) "
            "VALUES (?, ?, ?, ?, 1)",
            (ev.ip, ev.port, ev.proto, ts),
        )
    elif isinstance(ev, Fetched):
        con.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?)", (ev.url_id, ts, ev.ok))
    else:
        return 0
    return 1


BURST = 30_000


async def _burst(url: str, rounds: bool, proxies: int, seed: int) -> int:
    """``BURST`` new proxies (after the workload's), as rounds or single events: the
    stream's head once they are in it."""
    form = "r" if rounds else "s"
    await publish_workload(Workload([url], form, BURST, BURST, seed, setup=False, first=proxies))
    return await head_seq(url)


async def _fold_with_dead_axiom(url: str, head: int, workdir: Path) -> tuple[float, float]:
    """The same fold with the Axiom tap on, Axiom a port that accepts and never answers;
    then once more with the tap off, since a second fold in one process runs a few
    percent apart from the first (order effects as large as the tap's cost)."""
    from ops.telemetry.tap import Tap, TapConfig

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(1000)
    tap = Tap(
        TapConfig(
            token="xaat-bench", dataset="bench", url=f"http://127.0.0.1:{hole.getsockname()[1]}"
        )
    )
    await tap.start()
    try:
        t = time.perf_counter()
        await replay(
            Firehose(url).batches(until=head), workdir / "tapped.duckdb", on_batch=tap.feed
        )
        rate = head / (time.perf_counter() - t)
    finally:
        await tap.stop()
        hole.close()
    t = time.perf_counter()
    await replay(Firehose(url).batches(until=head), workdir / "untapped.duckdb")
    return rate, head / (time.perf_counter() - t)


async def bench_fold(
    fold: Fold, baseline_budget_s: float = 20.0, tap_check: bool = True
) -> dict[str, Any]:
    """``fold.events`` observations as rounds (the fleet's form from the ``batches``
    setting), or with ``fold.singles``, ``fold.events`` single events."""
    events, proxies, seed = fold.events, fold.proxies, fold.seed
    rounds = not fold.singles
    with tempfile.TemporaryDirectory(prefix="ppf-bench-") as tmp, contextlib.ExitStack() as own:
        workdir = Path(tmp)
        nats_url = fold.nats or own.enter_context(nats_servers(workdir, "nats"))[0].url
        if rounds:  # the workload as the fleet sends it: events counts observations
            await publish_workload(Workload([nats_url], "r", events, proxies, seed))
            head = await head_seq(nats_url)
        else:
            head = await publish_synthetic(nats_url, events, proxies, seed)
        ceiling = await _ceiling_nats_py(nats_url, head)
        lean = await _firehose_raw(nats_url, head)
        gc.collect()
        gateway = await gateway_catch_up(
            nats_url, head, lambda: _burst(nats_url, rounds, proxies, seed)
        )
        gc.collect()
        rss_before = _rss_mb()
        progress = Progress("fold", head)
        t = time.perf_counter()
        folder = await replay(
            Firehose(nats_url).batches(until=head),
            workdir / "fold.duckdb",
            on_progress=progress.update,
        )
        fold_s = time.perf_counter() - t
        progress.close()
        seq = folder.state.last_seq
        t = time.perf_counter()
        live_digest = digest(folder.state)
        digest_s = time.perf_counter() - t
        rss_fold = _rss_mb()
        proxies_in_projection = len(folder.state.proxies)
        del folder
        restored = Store(workdir / "fold.duckdb")
        restore_ok = digest(restored.restore()) == live_digest
        restored.close()
        tapped = await _fold_with_dead_axiom(nats_url, head, workdir) if tap_check else None
        baseline = await _sqlite_baseline(nats_url, head, baseline_budget_s, workdir)
    fold_rate = seq / fold_s
    observations = events if rounds else seq
    gateway_rate = observations / gateway["seconds"]
    raw_rate = lean * observations / seq  # the raw read in observations a second
    return {
        "form": "rounds" if rounds else "singles",
        "events": seq,
        "observations": observations,
        # What a fresh gateway delivers: from its first message read to the served view
        # holding the last, wall clock, against the old master's upsert per report and
        # the raw read, in the same run (ops/bench/catchup.py).
        "gateway_observations_per_s": round(gateway_rate),
        "gateway_vs_sqlite": round(gateway_rate / baseline["reports_per_s"], 3),
        "gateway_vs_raw_read": round(gateway_rate / raw_rate, 3),
        "gateway_seconds": gateway["seconds"],
        "gateway_fold_seconds": gateway["fold_seconds"],
        "gateway_view_after_fold_s": gateway["view_after_fold_s"],
        # BURST new proxies published once it caught up: from the fold's last of them
        # to the served view holding it.
        "gateway_view_after_burst": gateway["view_after_burst"],
        "gateway_cpu_seconds": gateway["cpu_seconds"],
        "raw_read_observations_per_s": round(raw_rate),
        "fold_observations_per_s": round(observations / fold_s),
        "seed": seed,
        "distinct_proxies": proxies_in_projection,
        "fold_events_per_s": round(fold_rate),
        "fold_seconds": round(fold_s, 2),
        "ceiling_nats_py_ordered_cb_per_s": round(ceiling),
        "fold_vs_ceiling": round(fold_rate / ceiling, 3),
        "firehose_raw_per_s": round(lean),
        "fold_vs_firehose_raw": round(fold_rate / lean, 3),
        "digest_seconds": round(digest_s, 2),
        "peak_rss_mb": round(rss_fold),
        "rss_before_fold_mb": round(rss_before),
        "restore_digest_equal": restore_ok,
        # eventlog/_frames.c, or the stream reader's Python twin
        "native_frames": native_frames(),
        "fold_with_dead_axiom_tap_per_s": round(tapped[0]) if tapped else None,
        "fold_tap_off_again_per_s": round(tapped[1]) if tapped else None,
        "dead_tap_vs_tap_off": round(2 * tapped[0] / (fold_rate + tapped[1]), 3)
        if tapped
        else None,
        "sqlite_baseline_reports_per_s": round(baseline["reports_per_s"]),
        "sqlite_baseline_reports": baseline["reports"],
        "speedup_vs_sqlite": round(observations / fold_s / baseline["reports_per_s"], 1),
        "digest": live_digest,
    }


async def _fold_interleaved(
    urls: list[str],
    heads: list[int],
    workdir: Path,
    run: int,
    timelines: list[list[int]],
) -> tuple[list[float], list[float]]:
    """Fold the streams at ``urls`` side by side in this process, a batch of each in
    turn, as ``replay`` folds one (``Folder.apply`` per batch, then one checkpoint of the
    whole state); returns each stream's (wall, CPU) seconds: the time spent on its own
    turns, reading its batches and folding them, and writing its file at the end.
    ``timelines[i]`` is set to stream i's first and last message times (server ms).

    Why: runs of one stream alone, seconds apart, differ by 5-10 % on this machine
    (BENCHMARKS.md), as much as the cost measured. Side by side, every moment
    of the machine's weather is shared by both streams, a batch (about 2,500 messages,
    milliseconds) at a time. Waiting on a server is still each stream's own: while one
    stream folds, the other's server fills its socket, as a server does for a fold that
    keeps it busy.
    """
    n = len(urls)
    folders = [Folder(State()) for _ in range(n)]
    writers = [
        Checkpointer(
            workdir / f"side-{i}-{run}.duckdb",
            every_events=sys.maxsize,
            every_ms=sys.maxsize,
            keep_digest=False,
        )
        for i in range(n)
    ]
    for writer in writers:
        await writer.start()
    streams = [
        Firehose(url).batches(until=head).__aiter__() for url, head in zip(urls, heads, strict=True)
    ]
    wall, cpu = [0.0] * n, [0.0] * n
    active = list(range(n)) if run % 2 == 0 else list(reversed(range(n)))
    try:
        while active:
            for i in list(active):
                c, t = time.process_time(), time.perf_counter()
                try:
                    batch = await streams[i].__anext__()
                except StopAsyncIteration:
                    await writers[i].flush(folders[i].state)
                    active.remove(i)
                else:
                    folders[i].apply(batch)
                    timelines[i][0] = timelines[i][0] or batch[0][1]
                    timelines[i][1] = batch[-1][1]
                wall[i] += time.perf_counter() - t
                cpu[i] += time.process_time() - c
    finally:
        for writer in writers:
            await writer.close()
    for folder, head in zip(folders, heads, strict=True):
        if folder.state.last_seq != head:
            raise RuntimeError(f"folded to {folder.state.last_seq}, the stream's head is {head}")
    return wall, cpu


async def bench_located(fold: Fold) -> dict[str, Any]:
    """What ``Located`` adds to the fold: the same synthetic stream without and with one
    ``Located`` per distinct proxy, in two servers, folded in this one process, medians
    compared.

    Two methods. ``interleaved`` runs fold both streams side by side, a batch of each in
    turn (``_fold_interleaved``): the decisive figure, since both see the same machine.
    ``pairs`` runs fold them one after the other (A B, B A, ...), each after a full
    collection: the older method, kept beside it, whose pairs differ by as much as the
    cost. Wall seconds are the figure; the process's CPU seconds (the fold's own work,
    without waiting on the server) are given beside them.
    """
    events, proxies, seed = fold.events, fold.proxies, fold.seed
    pairs, interleaved = fold.pairs, fold.interleaved
    with tempfile.TemporaryDirectory(prefix="ppf-bench-") as tmp:
        workdir = Path(tmp)
        with nats_servers(workdir, "plain", "located") as servers:
            urls = [server.url for server in servers]
            heads = await synthetic_in_lockstep(urls, events, proxies, seed, located_in=1)
            timelines: list[list[int]] = [[0, 0], [0, 0]]
            side_wall: list[list[float]] = [[], []]
            side_cpu: list[list[float]] = [[], []]
            for run in range(interleaved):
                gc.collect()
                wall, cpu = await _fold_interleaved(urls, heads, workdir, run, timelines)
                for i in (0, 1):
                    side_wall[i].append(round(wall[i], 2))
                    side_cpu[i].append(round(cpu[i], 2))
            times: list[list[float]] = [[], []]
            cpu_s: list[list[float]] = [[], []]
            for run in range(pairs):
                for i in (0, 1) if run % 2 == 0 else (1, 0):
                    gc.collect()
                    c, t = time.process_time(), time.perf_counter()
                    folder = await replay(
                        Firehose(urls[i]).batches(until=heads[i]),
                        workdir / f"fold-{i}-{run}.duckdb",
                    )
                    times[i].append(round(time.perf_counter() - t, 2))
                    cpu_s[i].append(round(time.process_time() - c, 2))
                    assert folder.state.last_seq == heads[i]
                    del folder
    result: dict[str, Any] = {
        "events": heads[0],
        "located_events": heads[1] - heads[0],
        "seed": seed,
    }
    if interleaved:
        # Published in lockstep (ops/bench/streams.py): the timelines agree within tens of ms.
        (first0, last0), (first1, last1) = timelines
        result |= {
            "timeline_seconds": round((last0 - first0) / 1000, 2),
            "timeline_skew_ms": max(abs(first1 - first0), abs(last1 - last0)),
        }
    if interleaved:
        result |= _compared("interleaved", side_wall, side_cpu)
    if pairs:
        result |= _compared("in_turn", times, cpu_s)
    return result


def _compared(method: str, wall: list[list[float]], cpu: list[list[float]]) -> dict[str, Any]:
    wall_by_run, cpu_by_run = pct_by_run(*wall), pct_by_run(*cpu)
    return {
        f"{method}_seconds_without_located": wall[0],
        f"{method}_seconds_with_located": wall[1],
        f"{method}_cpu_seconds_without_located": cpu[0],
        f"{method}_cpu_seconds_with_located": cpu[1],
        f"{method}_located_adds_pct": pct_of_medians(*wall),
        f"{method}_located_adds_cpu_pct": pct_of_medians(*cpu),
        # Run by run (the two sides of one run, or of one pair): how far the runs agree,
        # and their median, the paired figure: the two sides of a run saw the same
        # machine, where the medians above pair a side's run with another run's.
        f"{method}_located_adds_pct_by_run": wall_by_run,
        f"{method}_located_adds_cpu_pct_by_run": cpu_by_run,
        f"{method}_located_adds_pct_paired": statistics.median(wall_by_run),
        f"{method}_located_adds_cpu_pct_paired": statistics.median(cpu_by_run),
        # How sure the paired figure is: the runs' 95 % interval for their median (None
        # under 6 runs). The bar "adds < 5 %" is met as measured when all of it is under.
        f"{method}_located_adds_pct_paired_ci95": median_ci(wall_by_run),
        f"{method}_located_adds_cpu_pct_paired_ci95": median_ci(cpu_by_run),
    }


def print_fold(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:36} {value}")
