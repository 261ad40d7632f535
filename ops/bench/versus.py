"""``ppf bench fold --versus DIR``: this tree's fold against another tree's, side by side.

Why: a bar of "no worse than before" compares two versions of the code, and runs of one
version seconds apart differ here by 5-10 % (BENCHMARKS.md), as much as the difference
asked about. So both folds run at once, one process per tree, on one stored log, and
take turns a batch at a time (about 2,500 messages, milliseconds): every moment of the
machine's weather falls on both. Each process counts the wall and CPU seconds of its own
turns, reading its batches and folding them, and of writing its file at the end.

``DIR`` is a checkout of the other version (``git worktree add DIR COMMIT``) with its C
built; its processes run this interpreter with ``DIR`` first on the path, so each folds
with its own code. Both fold with the fold's collector settings and write their file
once, at the end. The log is published by this tree, as ``ppf bench fold`` publishes it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.bench.compare import median_ci, pct_by_run, pct_of_medians
from ops.bench.harness import checkout, nats_servers
from ops.bench.options import Fold
from ops.bench.streams import publish_synthetic
from ops.collector import THRESHOLDS

__all__ = ["Side", "bench_versus", "side_by_side"]

# Runs inside either tree (cwd), as `python -c`: folds the stream, a batch per turn; the
# parent says "g" on stdin for each turn, the child answers "d", or "e" and its figures.
_CHILD = r"""
import asyncio, gc, inspect, json, sys, time
gc.set_threshold(*json.loads(sys.argv[4]))
url, head, db = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    from eventlog.stream import Firehose
except ImportError:  # trees before ops/ had its rooms
    from ops.firehose import Firehose
from projections.replay import replay
rd, wr = sys.stdin.buffer, sys.stdout.buffer
spent = {"wall": 0.0, "cpu": 0.0}
start = [0.0, 0.0]
def begin():
    if rd.read(1) != b"g":
        raise SystemExit("the parent left")
    start[:] = time.perf_counter(), time.process_time()
def end():
    spent["wall"] += time.perf_counter() - start[0]
    spent["cpu"] += time.process_time() - start[1]
async def turns(batches):
    it = batches.__aiter__()
    while True:
        begin()
        try:
            batch = await it.__anext__()
        except StopAsyncIteration:
            return  # this last turn goes on through replay's final write
        yield batch
        end()
        wr.write(b"d")
        wr.flush()
async def main():
    once = {}
    if inspect.signature(replay).parameters["every_events"].default is not None:
        once = {"every_events": sys.maxsize, "every_ms": sys.maxsize}  # older: write once too
    folder = await replay(turns(Firehose(url).batches(until=head)), db, **once)
    end()
    spent["seq"] = folder.state.last_seq
    wr.write(b"e" + json.dumps(spent).encode() + b"\n")
    wr.flush()
asyncio.run(main())
"""


Side = tuple[Path, str, int]  # (tree, the NATS URL of its stream, that stream's head)


def side_by_side(sides: dict[str, Side], workdir: Path, run: int) -> dict[str, dict[str, float]]:
    """Fold each side's stream with its tree, one process each, taking turns a batch at
    a time; which starts first rotates with ``run``. Each side's wall and CPU seconds."""
    names = list(sides)
    names = names[run % len(names) :] + names[: run % len(names)]
    kids = {}
    for name in names:
        tree, url, head = sides[name]
        db = workdir / f"{name}-{run}.duckdb"
        argv = [sys.executable, "-c", _CHILD, url, str(head), str(db), json.dumps(THRESHOLDS)]
        kids[name] = subprocess.Popen(argv, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    figures: dict[str, dict[str, float]] = {}
    active = list(names)
    try:
        while active:
            for name in list(active):
                kid = kids[name]
                assert kid.stdin is not None and kid.stdout is not None
                kid.stdin.write(b"g")
                kid.stdin.flush()
                said = kid.stdout.read(1)
                if said == b"e":
                    figures[name] = json.loads(kid.stdout.readline())
                    active.remove(name)
                elif said != b"d":
                    code = kid.wait()
                    raise RuntimeError(f"the {name} fold ended without its figures (exit {code})")
    finally:
        for kid in kids.values():
            if kid.poll() is None:
                kid.kill()
            kid.wait()
    for name, fig in figures.items():
        if fig["seq"] != sides[name][2]:
            raise RuntimeError(f"the {name} fold reached {fig['seq']} of {sides[name][2]}")
    return figures


async def bench_versus(fold: Fold) -> dict[str, Any]:
    """Fold the synthetic stream with this tree and ``fold.versus`` side by side, ``runs``
    times (which starts first alternates); medians and run-by-run ratios, new against
    old."""
    assert fold.versus is not None
    events, proxies, seed, runs = fold.events, fold.proxies, fold.seed, fold.runs
    trees = {"old": checkout(fold.versus), "new": Path(__file__).resolve().parents[2]}
    out: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in trees}
    with tempfile.TemporaryDirectory(prefix="ppf-bench-versus-") as tmp:
        workdir = Path(tmp)
        with nats_servers(workdir, "nats") as (server,):
            head = await publish_synthetic(server.url, events, proxies, seed)
            for run in range(runs):
                t = time.perf_counter()
                sides = {name: (tree, server.url, head) for name, tree in trees.items()}
                figures = await asyncio.to_thread(side_by_side, sides, workdir, run)
                for name, fig in figures.items():
                    out[name]["wall"].append(round(fig["wall"], 3))
                    out[name]["cpu"].append(round(fig["cpu"], 3))
                print(f"run {run + 1}/{runs}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    result: dict[str, Any] = {"events": head, "seed": seed, "old": str(trees["old"])}
    for kind in ("wall", "cpu"):
        old, new = out["old"][kind], out["new"][kind]
        result[f"old_{kind}_s"], result[f"new_{kind}_s"] = old, new
        result[f"new_vs_old_{kind}_pct"] = pct_of_medians(old, new)
        by_run = result[f"new_vs_old_{kind}_pct_by_run"] = pct_by_run(old, new)
        result[f"new_vs_old_{kind}_pct_by_run_ci95"] = median_ci(by_run)  # None under 6 runs
    return result
