"""``ppf bench ...``: every figure in BENCHMARKS.md comes from one of these.

One parser per benchmark, so each takes its own flags and refuses another's
(``ppf bench fold --tls`` is an error, not a run that ignores it).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ops.cli.bench_serve import serve_flags, serve_run

__all__ = ["register"]

Run = Callable[[argparse.Namespace], Awaitable[dict[str, Any]] | dict[str, Any]]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bn = sub.add_parser("bench", help="benchmarks (BENCHMARKS.md)")
    what = bn.add_subparsers(dest="what", required=True, metavar="BENCH")

    def bench(name: str, help: str, run: Run | str) -> argparse.ArgumentParser:
        """A benchmark's parser; ``run`` its runner, or ``"module:function ARG..."``."""
        p = what.add_parser(name, help=help)
        p.add_argument("--json", action="store_true", help="one JSON object")
        p.set_defaults(run=_runner(_call(run) if isinstance(run, str) else run))
        return p

    fold = bench("fold", "what a gateway catching up with a real stream delivers", _fold)
    fold.add_argument(
        "--events", type=int, default=1_000_000, help="observations, as rounds (or --singles)"
    )
    fold.add_argument(
        "--singles", action="store_true", help="single events, as agents sent before rounds"
    )
    fold.add_argument("--proxies", type=int, default=100_000)
    fold.add_argument("--seed", type=int, default=1)
    fold.add_argument("--nats", default=None, help="an existing NATS (default: its own)")
    mode = fold.add_mutually_exclusive_group()
    rounds = "the pinned workload as single events and as rounds, folded side by side"
    mode.add_argument("--rounds", action="store_true", help=rounds)
    located = "what Located adds (the stream without and with one Located per distinct proxy)"
    mode.add_argument("--located", action="store_true", help=located)
    checks = "--rounds: proxy checks made"
    fold.add_argument("--observations", type=int, default=1_000_000, help=checks)
    fold.add_argument("--pairs", type=int, default=3, help="--located: runs of each in turn")
    side = "--located: runs side by side, in turns"
    fold.add_argument("--interleaved", type=int, default=3, help=side)
    fold.add_argument(
        "--versus",
        default=None,
        metavar="DIR",
        help="against the checkout in DIR, side by side (with --rounds: on the single events)",
    )
    fold.add_argument("--runs", type=int, default=5, help="--versus, --rounds: runs")
    catch_up = "with --versus: a fresh gateway's catch-up in each tree, in turns"
    fold.add_argument("--catch-up", action="store_true", help=catch_up)

    lease = bench("lease", "lease grants under concurrent agents", _lease)
    lease.add_argument("--clients", type=int, default=50, help="concurrent agents")
    lease.add_argument("--seconds", type=float, default=10.0)
    lease.add_argument("--count", type=int, default=1, help="targets per request")

    query_pool = "ops.bench.gateway:bench_query proxies"
    query = bench("query", "GET /v1/proxies over a large pool", query_pool)
    query.add_argument("--proxies", type=int, default=100_000)

    snap = bench(
        "snapshot",
        "a new gateway ready from a snapshot, against from seq 1",
        "ops.bench.snapshot:bench_snapshot observations proxies runs",
    )
    snap.add_argument("--observations", type=int, default=10_000_000)
    snap.add_argument("--proxies", type=int, default=1_000_000)
    snap.add_argument("--runs", type=int, default=2, help="A B runs, interleaved")
    stats = bench("stats", "/v1/stats and lease latency while the fold works", _stats)
    stats.add_argument("--proxies", type=int, default=100_000)
    stats.add_argument("--seconds", type=float, default=10.0)
    stats.add_argument("--rate", type=int, default=10_000, help="events/s folded meanwhile")
    backlog = "observations, as rounds over --proxies new proxies, of the backlog phase (0: none)"
    stats.add_argument("--backlog-rounds", type=int, default=1_000_000, help=backlog)
    runs = "backlog phases, each caught up with, then asked for 10 s"
    stats.add_argument("--backlog-runs", type=int, default=1, help=runs)
    singles = "observations over --proxies new proxies, as single events and as rounds (0: none)"
    stats.add_argument("--singles", type=int, default=300_000, help=singles)
    stats.add_argument("--singles-runs", type=int, default=5, help="runs of each form, interleaved")

    extract = bench(
        "extract",
        "extraction of a dense list",
        "ops.bench.extract:bench_extract mb seed",
    )
    extract.add_argument("--mb", type=int, default=30, help="size of the dense list")
    extract.add_argument("--seed", type=int, default=1)

    check = bench("check", "proxy checks through real proxies", _check)
    check.add_argument("--checks", type=int, default=10_000)
    check.add_argument("--tls", action="store_true", help="tunnels carry TLS to a pinned judge")

    harvest = bench(
        "harvest",
        "a worker harvesting a list of mostly dead proxies",
        "ops.bench.harvest:bench_harvest candidates working_share",
    )
    harvest.add_argument("--candidates", type=int, default=10_000)
    harvest.add_argument("--working-share", type=float, default=0.05)

    pool = bench("pool", "pool truth under churn", _pool)
    pool.add_argument("--profile", default="steady", help="steady, flappy or outage")
    pool.add_argument("--proxies", type=int, default=200)
    pool.add_argument("--seed", type=int, default=1)
    pool.add_argument("--speed", type=float, default=10.0, help="simulated s a second")
    pool.add_argument("--duration", type=int, default=3_600, help="simulated seconds")
    pool.add_argument("--budget", type=int, default=0, help="rechecks an hour (0: none)")
    pool.add_argument("--interval", type=int, default=0, help="recheck interval (0: defaults)")
    failing = "a failing proxy's interval (0: half --interval)"
    pool.add_argument("--failing", type=int, default=0, help=failing)

    ingest = bench(
        "ingest",
        "the deposit ingest never lists the store",
        "ops.bench.ingest:bench_ingest sweeps sweep_s deposits missing",
    )
    ingest.add_argument("--sweeps", type=int, default=50, help="idle sweep periods")
    ingest.add_argument("--sweep-s", type=float, default=0.1, help="the sweep period")
    ingest.add_argument("--deposits", type=int, default=200, help="pages deposited")
    ingest.add_argument("--missing", type=int, default=10, help="announced, never stored")

    serve_flags(
        bench("serve", "the rotating endpoint, against going directly or by workers", serve_run)
    )

    churn = bench("serve-churn", "the endpoint in the churn lab, hedged and not (root)",
                  "ops.bench.servechurn:bench_serve_churn requests concurrency")  # fmt: skip
    churn.add_argument("--requests", type=int, default=10_000, help="through the hedged one")
    churn.add_argument("--concurrency", type=int, default=40)

    sites = bench(
        "sites",
        "routing by site in the world in a box (root)",
        "ops.bench.sites:bench_sites learn measured tree",
    )
    sites.add_argument("--learn", type=int, default=100, help="requests a site and scheme")
    sites.add_argument("--measured", type=int, default=300, help="measured after learning")
    sites.add_argument("--tree", type=Path, default=None, help="another commit's checkout")

    to = "ops.bench.sitefold:bench_fold_sites tree observations proxies runs"
    fs = bench("fold-sites", "the fold with site verdicts, against another tree's", to)
    fs.add_argument("--tree", type=Path, required=True, help="the other commit's checkout")
    fs.add_argument("--observations", type=int, default=300_000)
    fs.add_argument("--proxies", type=int, default=100_000)
    fs.add_argument("--runs", type=int, default=5, help="runs of each, in turns")

    state = bench(
        "site-state",
        "per-site standing's cost to a gateway",
        "ops.bench.sitestate:bench_site_state observations proxies sites cells runs asks tree",
    )
    state.add_argument("--observations", type=int, default=300_000)
    state.add_argument("--proxies", type=int, default=100_000)
    state.add_argument("--sites", type=int, default=200)
    state.add_argument("--cells", type=int, default=10_000, help="proxies with a verdict a site")
    state.add_argument("--runs", type=int, default=3, help="runs of each, in turns")
    other = "without: another commit's checkout, on its own snapshot of the same log"
    state.add_argument("--tree", type=Path, default=None, help=other)
    state.add_argument("--asks", type=int, default=200, help="/v1/stats and leases a run")

    read = bench("read", "the fold's reader, in plain and over TLS",
                 "ops.bench.read:bench_read messages runs")  # fmt: skip
    read.add_argument("--messages", type=int, default=200_000)
    read.add_argument("--runs", type=int, default=3, help="runs of each, in turns")

    marks = bench("marks", "the memory of the re-send window at many agents",
                  "ops.bench.marks:bench_marks agents window")  # fmt: skip
    marks.add_argument("--agents", type=int, default=1_000)
    marks.add_argument("--window", type=int, default=512)

    quality = bench("quality", "uptime and speed against the churn lab's truth (root)",
                    "ops.bench.quality:bench_quality proxies speed duration")  # fmt: skip
    quality.add_argument("--proxies", type=int, default=30)
    quality.add_argument("--speed", type=float, default=10.0, help="simulated seconds a second")
    quality.add_argument("--duration", type=int, default=1_800, help="simulated seconds")

    seed = bench(
        "seed",
        "seed nodes working a dump",
        "ops.bench.seed:bench_seed lines nodes working",
    )
    seed.add_argument("--lines", type=int, default=200_000, help="lines of the dump")
    seed.add_argument("--nodes", type=int, default=3, help="seed node processes")
    seed.add_argument("--working", type=int, default=300, help="working relays in the world")


def _runner(run: Run) -> Callable[[argparse.Namespace], Awaitable[int]]:
    async def go(args: argparse.Namespace) -> int:
        from ops.bench.fold import print_fold

        result = run(args)
        if not isinstance(result, dict):
            result = await result
        print_fold(result, args.json)
        return 0

    return go


async def _fold(args: argparse.Namespace) -> dict[str, Any]:
    from ops.collector import for_folding

    for_folding()  # measured as ppf folds (ops/collector.py)
    if args.rounds:
        from ops.bench.rounds import bench_rounds

        versus = Path(args.versus) if args.versus else None
        return await bench_rounds(args.observations, args.proxies, args.seed, versus, args.runs)
    if args.versus and args.catch_up:
        from ops.bench.catchup import bench_catch_up_versus

        forms = (args.events, args.proxies, args.seed, args.runs, not args.singles)
        return await bench_catch_up_versus(Path(args.versus), *forms)
    if args.versus:
        from ops.bench.versus import bench_versus

        return await bench_versus(
            Path(args.versus), args.events, args.proxies, args.seed, args.runs
        )
    if args.located:
        from ops.bench.fold import bench_located

        return await bench_located(
            args.events, args.proxies, args.seed, args.pairs, args.interleaved
        )
    from ops.bench.fold import bench_fold

    return await bench_fold(
        args.events, args.proxies, args.seed, args.nats, rounds=not args.singles
    )


async def _lease(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.gateway import bench_lease

    return await bench_lease(args.clients, args.seconds, count=args.count)


async def _stats(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.singles import bench_singles
    from ops.bench.stats import bench_stats

    out = await bench_stats(
        args.proxies,
        args.seconds,
        rate=args.rate,
        backlog_observations=args.backlog_rounds,
        backlog_runs=args.backlog_runs,
    )
    if args.singles:
        out["single_events"] = await bench_singles(
            args.singles, args.proxies, runs=args.singles_runs
        )
    return out


async def _check(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.check import bench_check

    return await bench_check(args.checks, tls=args.tls)


async def _pool(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.pool import bench_pool

    return await bench_pool(
        args.profile,
        args.proxies,
        args.seed,
        args.speed,
        args.duration,
        recheck_budget_per_hour=args.budget,
        interval_s=args.interval,
        failing_s=args.failing,
    )


def _call(spec: str) -> Run:
    """A benchmark's runner from ``"module:function ARG..."``: the function imported when
    it runs (a command's help loads no benchmark), called with those arguments in order."""
    target, *names = spec.split()

    def run(args: argparse.Namespace) -> Awaitable[dict[str, Any]] | dict[str, Any]:
        module, _, function = target.partition(":")
        bench: Callable[..., Awaitable[dict[str, Any]] | dict[str, Any]]
        bench = getattr(importlib.import_module(module), function)
        return bench(*(getattr(args, name) for name in names))

    return run
