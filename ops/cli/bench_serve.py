"""``ppf bench serve``'s flags: the endpoint against going directly, or, with
``--workers``, the endpoint as deployed under the load generator (ops/bench/loadgen.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ops.bench.upstreams import KINDS

__all__ = ["serve_flags", "serve_run"]

MODES = ("http", "https", "tunnel")


def serve_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--requests", type=int, default=None, help="requests a run (a count)")
    serve.add_argument("--concurrency", type=int, default=20, help="requests in flight at most")
    serve.add_argument("--runs", type=int, default=5, help="runs of each, in turns")
    serve.add_argument("--tunnels", type=int, default=1_000, help="tunnels held open")
    serve.add_argument(
        "--workers",
        default=None,
        metavar="N[,N...]",
        help="through `ppf serve --workers N` fed by a real gateway, for each N in turn, under "
        "the load generator (its figures per N, and the CPU a request of each N over the first)",
    )
    serve.add_argument(
        "--duration", type=float, default=None, metavar="S", help="--workers: for S s"
    )
    serve.add_argument("--rate", type=float, default=None, help="--workers: requests a second")
    serve.add_argument(
        "--mode", action="append", choices=MODES, help="--workers: the loads (default: each)"
    )
    serve.add_argument(
        "--keepalive", choices=("on", "off", "both"), default="both", help="--workers"
    )
    serve.add_argument(
        "--versus",
        default=None,
        metavar="DIR",
        help="the endpoint's CPU a request against another checkout's (git worktree add DIR "
        "REV), in interleaved runs: plain HTTP through each upstream, and inside tunnels",
    )
    serve.add_argument(
        "--upstream",
        choices=KINDS,
        action="append",
        help="the upstream's kind (default: each; --workers: http)",
    )


async def serve_run(args: argparse.Namespace) -> dict[str, Any]:
    if args.versus is not None:
        from ops.bench.serve_versus import bench_serve_versus

        return await bench_serve_versus(Path(args.versus), args.requests or 10_000, args.runs)
    if args.workers is None:
        from ops.bench.serve import bench_serve

        requests = args.requests or 5_000
        kinds = tuple(args.upstream or KINDS)
        return await bench_serve(
            requests, args.concurrency, args.runs, tunnels=args.tunnels, kinds=kinds
        )
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
    chosen: list[str] = args.upstream or ["http"]
    if len(chosen) == 1:
        return await bench_serve_workers(workers, loads, args.runs, chosen[0])
    return {k: await bench_serve_workers(workers, loads, args.runs, k) for k in chosen}
