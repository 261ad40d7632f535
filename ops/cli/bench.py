"""``ppf bench ...``: every figure in BENCHMARKS.md comes from one of these."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]

WHAT = ["fold", "lease", "query", "stats", "extract", "check", "harvest", "pool", "ingest", "seed"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bn = sub.add_parser("bench", help="benchmarks")
    bn.add_argument("what", choices=WHAT)
    bn.add_argument("--events", type=int, default=1_000_000)
    bn.add_argument("--proxies", type=int, default=100_000)
    bn.add_argument("--seed", type=int, default=1)
    bn.add_argument("--clients", type=int, default=50, help="lease: concurrent agents")
    bn.add_argument("--seconds", type=float, default=10.0, help="lease, stats: how long")
    bn.add_argument("--count", type=int, default=1, help="lease: targets per request")
    bn.add_argument("--rate", type=int, default=10_000, help="stats: events/s folded meanwhile")
    bn.add_argument("--mb", type=int, default=30, help="extract: size of the dense list")
    bn.add_argument("--checks", type=int, default=10_000, help="check: how many")
    bn.add_argument("--tls", action="store_true", help="check: tunnels carry TLS to a pinned judge")
    bn.add_argument("--candidates", type=int, default=10_000, help="harvest: listed")
    bn.add_argument("--working-share", type=float, default=0.05, help="harvest: that work")
    bn.add_argument(
        "--located",
        action="store_true",
        help="fold: what Located adds (the stream without and with one Located per "
        "distinct proxy, folded in turn)",
    )
    bn.add_argument(
        "--pairs", type=int, default=3, help="fold --located: runs of each stream in turn"
    )
    bn.add_argument(
        "--interleaved",
        type=int,
        default=3,
        help="fold --located: runs folding both streams side by side, a batch of each in turn",
    )
    bn.add_argument(
        "--versus",
        default=None,
        metavar="DIR",
        help="fold: against the checkout in DIR, side by side, a batch each in turn",
    )
    bn.add_argument("--runs", type=int, default=5, help="fold --versus: runs")
    bn.add_argument("--profile", default="steady", help="pool: steady, flappy or outage")
    bn.add_argument("--speed", type=float, default=10.0, help="pool: simulated s a second")
    bn.add_argument("--duration", type=int, default=3_600, help="pool: simulated seconds")
    bn.add_argument("--budget", type=int, default=0, help="pool: rechecks an hour (0: none)")
    bn.add_argument(
        "--interval", type=int, default=0, help="pool: recheck interval, simulated s (0: defaults)"
    )
    bn.add_argument(
        "--failing",
        type=int,
        default=0,
        help="pool: a failing proxy's recheck interval, simulated s (0: half of --interval)",
    )
    bn.add_argument("--sweeps", type=int, default=50, help="ingest: idle sweep periods")
    bn.add_argument("--sweep-s", type=float, default=0.1, help="ingest: the sweep period")
    bn.add_argument("--deposits", type=int, default=200, help="ingest: pages deposited")
    bn.add_argument("--missing", type=int, default=10, help="ingest: announced, never stored")
    bn.add_argument("--lines", type=int, default=200_000, help="seed: lines of the dump")
    bn.add_argument("--nodes", type=int, default=3, help="seed: seed node processes")
    bn.add_argument("--working", type=int, default=300, help="seed: working relays in the world")
    bn.add_argument("--nats", default=None)
    bn.add_argument("--json", action="store_true")
    bn.set_defaults(run=_bench)


async def _bench(args: argparse.Namespace) -> int:
    from ops.bench.fold import bench_fold, print_fold
    from ops.collector import for_folding

    match args.what:
        case "fold":
            for_folding()  # measured as ppf folds (ops/collector.py)
            if args.versus:
                from pathlib import Path

                from ops.bench.versus import bench_versus

                result = await bench_versus(
                    Path(args.versus), args.events, args.proxies, args.seed, args.runs
                )
            elif args.located:
                from ops.bench.fold import bench_located

                result = await bench_located(
                    args.events, args.proxies, args.seed, args.pairs, args.interleaved
                )
            else:
                result = await bench_fold(args.events, args.proxies, args.seed, args.nats)
        case "lease":
            from ops.bench.gateway import bench_lease

            result = await bench_lease(args.clients, args.seconds, count=args.count)
        case "query":
            from ops.bench.gateway import bench_query

            result = await bench_query(args.proxies)
        case "stats":
            from ops.bench.stats import bench_stats

            result = await bench_stats(args.proxies, args.seconds, rate=args.rate)
        case "extract":
            from ops.bench.extract import bench_extract

            result = bench_extract(args.mb, args.seed)
        case "harvest":
            from ops.bench.harvest import bench_harvest

            result = await bench_harvest(args.candidates, args.working_share)
        case "pool":
            from ops.bench.pool import bench_pool

            proxies = args.proxies if args.proxies != 100_000 else 200  # (fold's default)
            result = await bench_pool(
                args.profile,
                proxies,
                args.seed,
                args.speed,
                args.duration,
                recheck_budget_per_hour=args.budget,
                interval_s=args.interval,
                failing_s=args.failing,
            )
        case "ingest":
            from ops.bench.ingest import bench_ingest

            result = await bench_ingest(args.sweeps, args.sweep_s, args.deposits, args.missing)
        case "seed":
            from ops.bench.seed import bench_seed

            result = await bench_seed(args.lines, args.nodes, args.working)
        case "check":
            from ops.bench.check import bench_check

            result = await bench_check(args.checks, tls=args.tls)
        case _:
            print(f"ppf bench {args.what}: not built yet (see the open issues)", file=sys.stderr)
            return 2
    print_fold(result, args.json)
    return 0
