"""``ppf bench serve``: the endpoint against going directly, or, with ``--workers``, the
endpoint as deployed under the load generator (ops/bench/loadgen.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ops.bench.options import MODES, Serve

__all__ = ["serve_run"]


async def serve_run(args: Serve) -> dict[str, Any]:
    if args.versus is not None:
        from ops.bench.serve_versus import LOADS, bench_serve_versus

        versus_loads = tuple(args.upstream) if args.upstream else LOADS  # plain HTTP: each
        return await bench_serve_versus(
            Path(args.versus),
            args.requests or 10_000,
            args.runs,
            versus_loads,
            args.site_closes,
            args.site_html,
        )
    if args.workers is None:
        from ops.bench.serve import bench_serve

        return await bench_serve(args)
    from ops.bench.loadgen import Load
    from ops.bench.workers import bench_serve_workers

    if args.requests is None and args.duration is None:
        args.requests = 2_000
    keep = {"on": [True], "off": [False], "both": [True, False]}[args.keepalive]
    loads = [
        Load(mode, alive, args.requests, args.duration, args.rate, args.concurrency)
        for mode in args.mode or MODES
        for alive in keep
    ]
    workers = [int(n) for n in args.workers.split(",")]
    chosen: list[str] = list(args.upstream or ["http"])
    if len(chosen) == 1:
        return await bench_serve_workers(workers, loads, args.runs, chosen[0])
    return {k: await bench_serve_workers(workers, loads, args.runs, k) for k in chosen}
