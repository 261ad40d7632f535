"""``ppf up``, ``ppf gateway``, ``ppf fold``: the long-running roles.

Each command is composed from small start functions that push their own cleanup onto
one ``AsyncExitStack``, so what started is stopped in reverse order, whatever failed.
"""

from __future__ import annotations

import argparse
import gc
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import structlog
from aiohttp import web

from events import Settings
from gateway.guard import GuardedRunner
from gateway.judge import JudgeKeys
from gateway.natsauth import NatsAuth
from ops.cli.admin import reconfigure
from ops.cli.common import DEFAULT_NATS, data_dir, hostport, listen, wait_for_signal
from ops.cli.judges import agent_judges, judge_site, tls_judge_site
from ops.cli.local import LOCAL_AGENTS, enroll_local_agents, local_agents
from ops.geo import Locator
from ops.nats.client import Log
from ops.nats.server import NatsServer
from projections.live import FoldService
from reducers import State

__all__ = ["register"]

log = structlog.get_logger("ppf")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="the whole system on one machine")
    up.add_argument("--data", default=None, help="default: $PPF_DATA or ./data")
    up.add_argument("--listen", default="127.0.0.1:8080", type=listen)
    up.add_argument("--nats-listen", default="127.0.0.1:4222", type=listen)
    up.add_argument("--nats", default=None, help="use this NATS; start none")
    up.add_argument("--no-agents", action="store_true")
    up.add_argument(
        "--no-seed", action="store_true", help="start with no sources (no built-in lists)"
    )
    up.add_argument("--lab", action="store_true", help="accept loopback and private addresses")
    up.add_argument("--private-queries", action="store_true", help="queries need a token")
    up.add_argument(
        "--judge-tls-listen",
        default="127.0.0.1:8443",
        help="the judge over TLS (self-signed, pinned by agents); 'off' for none",
    )
    up.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="URL",
        help="a judge for the local agents (repeatable; replaces the built-in public list)",
    )
    up.add_argument(
        "--https-target",
        action="append",
        default=[],
        metavar="URL",
        help="an HTTPS endpoint with a 2xx answer that working proxies are tried through "
        "(repeatable; default: a built-in list, none in a lab)",
    )
    up.add_argument(
        "--agents-idle",
        type=float,
        default=None,
        metavar="S",
        help="how long the local agents wait when there is no work (default: the worker "
        "5 s, the checker 30 s; a lab on a fast clock wants less)",
    )
    up.add_argument(
        "--public-url",
        default=None,
        metavar="URL",
        help="where the world reaches this machine's judge, e.g. http://203.0.113.5:8081/judge",
    )
    up.add_argument(
        "--judge-listen",
        default=None,
        type=listen,
        help="the judge's own listener (HOST:PORT) for --public-url; the API stays private",
    )
    up.add_argument(
        "--deposit-max-age-days",
        type=float,
        default=30.0,
        help="deposits (raw pages, seed batches) are deleted this long after their last deposit",
    )
    up.add_argument(
        "--reconcile-deposits",
        action="store_true",
        help="once a day, list the deposit store against the log (counted, reported)",
    )
    up.add_argument(
        "--deposit-max-gb",
        type=float,
        default=20.0,
        help="the deposits kept in all; past it the oldest are deleted first",
    )
    up.add_argument(
        "--disk-share",
        type=_share,
        default=0.8,
        help="bulk imports (seed leases, planning) pause while the deposit store or the "
        "log holds more than this share of the store's disk",
    )
    up.set_defaults(run=_up)

    gw = sub.add_parser("gateway", help="the HTTP gateway alone")
    gw.add_argument("--nats", default=DEFAULT_NATS)
    gw.add_argument("--listen", default="127.0.0.1:8080", type=listen)
    gw.add_argument("--private-queries", action="store_true", help="queries need a token")
    gw.add_argument(
        "--disk-share",
        type=_share,
        default=0.8,
        help="bulk imports (seed leases, planning) pause while the deposit store or the "
        "log holds more than this share of the store's disk",
    )
    gw.add_argument(
        "--store-disk",
        default=None,
        metavar="DIR",
        help="a directory on the disk the NATS store is on, weighed for --disk-share "
        "(default: no guard; the store is another machine's)",
    )
    gw.set_defaults(run=_gateway)

    fo = sub.add_parser("fold", help="the fold alone: projections to DuckDB, DLQ")
    fo.add_argument("--nats", default=DEFAULT_NATS)
    fo.add_argument("--data", default=None, help="default: $PPF_DATA or ./data")
    fo.add_argument(
        "--deposit-max-age-days",
        type=float,
        default=30.0,
        help="deposits (raw pages, seed batches) are deleted this long after their last deposit",
    )
    fo.add_argument(
        "--reconcile-deposits",
        action="store_true",
        help="once a day, list the deposit store against the log (counted, reported)",
    )
    fo.add_argument(
        "--deposit-max-gb",
        type=float,
        default=20.0,
        help="the deposits kept in all; past it the oldest are deleted first",
    )
    fo.set_defaults(run=_fold)


async def _up(args: argparse.Namespace) -> int:
    data = data_dir(args)
    async with AsyncExitStack() as stack:
        server = await _nats_server(stack, args, data)
        lg = await _log(stack, server.url if server else args.nats or DEFAULT_NATS, "ppf-up")
        await _configure(lg, args.lab)
        tokens = {} if args.no_agents else await enroll_local_agents(lg)
        fold = await _fold_service(stack, lg, data, dlq=True, args=args)
        agent_nats = server.agent_auth() if server is not None else None
        # A judge the world reaches signs its answers, for our agents only.
        keys = JudgeKeys.load(data / "judge.key") if args.public_url else None
        store = data / "nats" if server is not None else None  # an outside NATS: not ours
        base = await _gateway_site(stack, args, fold, lg, agent_nats, "up", keys, store)
        tls_judge = None
        if args.judge_tls_listen != "off":
            certs = data / "tls"
            tls_judge = await tls_judge_site(stack, args.judge_tls_listen, certs, keys)
        if args.judge_listen is not None:
            await judge_site(stack, args.judge_listen, keys or JudgeKeys.load(data / "judge.key"))
        judges, own = agent_judges(args, base)
        # Caught up first: the local agents' tokens must be in the projection before they
        # ask the gateway, and an empty log tells a first start.
        await fold.wait_for(await lg.head_seq(), 30)
        if not args.lab and not args.no_seed and not fold.state.sources:
            await _seed_sources(lg)
        if tokens:
            print(f"ppf up: the local agents check through {', '.join(judges)}", flush=True)
            await local_agents(stack, base, tokens, data, judges, own, args, tls_judge, keys)
        log.info("started", role="up", nats=lg.address)
        await _serve_forever(fold)
    return 0


async def _gateway(args: argparse.Namespace) -> int:
    async with AsyncExitStack() as stack:
        lg = await _log(stack, args.nats, "ppf-gateway")
        # A replica without a data dir: its projection lives in memory; its digest is
        # kept by a checkpoint writer on an in-memory database (see projections.live).
        fold = await _fold_service(stack, lg, None, dlq=False)
        store = Path(args.store_disk) if args.store_disk else None
        await _gateway_site(stack, args, fold, lg, None, "gateway", store=store)
        log.info("started", role="gateway", nats=lg.address)
        await _serve_forever(fold)
    return 0


async def _fold(args: argparse.Namespace) -> int:
    data = data_dir(args)
    async with AsyncExitStack() as stack:
        lg = await _log(stack, args.nats, "ppf-fold")
        fold = await _fold_service(stack, lg, data, dlq=True, args=args)
        print(f"ppf fold: nats {lg.address}  db {data / 'ppf.duckdb'}", flush=True)
        log.info("started", role="fold", nats=lg.address)
        await _serve_forever(fold)
    return 0


_PIN = object()


def _freeze_projections(state: State) -> None:
    """Keep the collector off the projections' containers (a million entries each at a
    million proxies) for good: ``gc.freeze`` exempts what exists, but a full collection
    first untracks a dict whose entries are all untracked (rows are gc=False Structs),
    and the next new key tracks it again as a young object, walked whole by each young
    collection (54 ms at a million proxies in isolation; /v1/stats saw 100-160 ms at
    100,000 and 1.06 s at a million). So each dict holds a tracked value for a moment,
    which tracks it, before the freeze; a tracked dict is only untracked by a full
    collection, and a frozen one is never collected."""
    gc.collect()
    for name in State.__slots__:
        value = getattr(state, name, None)
        if isinstance(value, dict):
            value[_PIN] = []
            del value[_PIN]
    gc.freeze()


async def _serve_forever(fold: FoldService) -> None:
    # Young collections every 10,000 net allocations, not 700: every request allocates,
    # and at 700 the collector's pauses set the lease p99 (`ppf bench lease`: 78 ms ->
    # 59 ms). Not 100,000 either: the fold's changed-row keys are young tuples, and a
    # collection of 100,000 of them held the loop 100-160 ms at a 100,000-proxy pool
    # (/v1/stats' max); at 10,000 the longest young collection measured 9-12 ms.
    gc.set_threshold(10_000, 50, 1000)
    _freeze_projections(fold.state)
    await wait_for_signal()


async def _nats_server(
    stack: AsyncExitStack, args: argparse.Namespace, data: Path
) -> NatsServer | None:
    """The embedded server, unless ``--nats`` names one."""
    if args.nats is not None:
        return None
    host, port = hostport(args.nats_listen, 4222)
    server = NatsServer(data / "nats", host, port)
    await server.astart()
    stack.push_async_callback(server.astop)
    return server


async def _log(stack: AsyncExitStack, url: str, name: str) -> Log:
    lg = await Log.connect(url, name=name)
    stack.push_async_callback(lg.close)
    await lg.ensure_stream()
    return lg


async def _configure(lg: Log, lab: bool) -> None:
    """Publish ``Configured`` when the log's last settings disagree with ``--lab`` or
    predate what ``ppf up`` runs with: per-agent subjects (ARCHITECTURE.md "Changes"),
    from which the fold refuses what an agent says as someone else; and trust, with
    the local agents as the operator's own (reducers/trust.py), from which any other
    agent's reports are served once checked or once it has earned trust."""
    local = tuple(name for name, _ in LOCAL_AGENTS)

    def change(s: Settings) -> Settings:
        trusted = (*s.trusted_agents, *(n for n in local if n not in s.trusted_agents))
        return msgspec.structs.replace(
            s, lab=lab, agent_subjects=True, trust=True, trusted_agents=trusted
        )

    if await reconfigure(lg, change) is not None:
        log.info("settings_published", lab=lab, agent_subjects=True, trust=True)


async def _fold_service(
    stack: AsyncExitStack,
    lg: Log,
    data: Path | None,
    *,
    dlq: bool,
    args: argparse.Namespace | None = None,
) -> FoldService:
    from ops.telemetry.tap import Tap, TapConfig

    db: Path | None = None
    tap = None
    if data is not None:
        data.mkdir(parents=True, exist_ok=True)
        db = data / "ppf.duckdb"
        config = TapConfig.from_env()
        tap = Tap(config) if config is not None else None
    fold = FoldService(lg, db=db, dlq=dlq, tap=tap, deposits=lg.deposits)
    await fold.start()
    stack.push_async_callback(fold.stop)
    if data is not None:  # the fold that persists reads the deposits into the log
        from projections.ingest import DepositIngest, Retention

        retention = None
        if args is not None:
            retention = Retention(
                max_age_s=args.deposit_max_age_days * 86_400,
                max_bytes=int(args.deposit_max_gb * 1024**3),
                mark=data / "deposits-retained.json",
                reconcile_every_s=86_400.0 if args.reconcile_deposits else None,
            )
        ingest = DepositIngest(
            fold, lg.deposits, sweep_s=_env_s("PPF_INGEST_SWEEP_S", 60), retention=retention
        )
        await ingest.start()
        stack.push_async_callback(ingest.stop)
    # Every replica locates what its projection has not located: the ids are
    # deterministic, so the log keeps one Located per address whoever publishes it.
    locator = Locator(fold)
    await locator.start()
    stack.push_async_callback(locator.stop)
    return fold


async def _gateway_site(
    stack: AsyncExitStack,
    args: argparse.Namespace,
    fold: FoldService,
    lg: Log,
    agent_nats: NatsAuth | None,
    role: str,
    keys: JudgeKeys | None = None,
    store: Path | None = None,
) -> str:
    """The HTTP API; returns its base URL. ``agent_nats``: the embedded server, whose
        logins this gateway decides, so each agent gets its own (an external NATS's users are
        its operator's: its agents publish over HTTP). ``store``: a directory on the disk the
    NATS store is on, for the disk budget guard (None: no guard)."""
    from gateway.app import make_app
    from gateway.diskguard import DiskGuard
    from gateway.http import GatewayConfig

    host, port = hostport(args.listen, 8080)
    config = GatewayConfig(
        private_queries=args.private_queries,
        agent_nats=agent_nats,
        judge_keys=keys,
        deposits=lg.deposits,
        disk_guard=None
        if store is None
        else DiskGuard(lg.stored_bytes, store, args.disk_share, _env_s("PPF_DISK_GUARD_S", 10)),
    )
    # Capped connections, headers in time (gateway/guard.py): aiohttp has neither.
    runner = GuardedRunner(make_app(fold, lg, config), access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, host, port).start()
    print(f"ppf {role}: gateway http://{host}:{port}  nats {lg.address}", flush=True)
    return f"http://{host}:{port}"


def _share(text: str) -> float:
    share = float(text)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"a share of the disk is in (0, 1], not {text}")
    return share


def _env_s(name: str, default: float) -> float:
    """A period from the environment: tests and benchmarks shorten the ingest's sweep
    (``PPF_INGEST_SWEEP_S``, 60 s) and the disk guard's weighing (``PPF_DISK_GUARD_S``,
    10 s)."""
    import os

    return float(os.environ.get(name, default))


async def _seed_sources(lg: Log) -> None:
    """A first start has work to do, for the local agents or remote ones: the built-in
    public lists (`ppf sources seed`). A lab starts empty."""
    from agents.seeds import SEEDS, source_added

    await lg.publish_many(source_added(dict(SEEDS), "seed"))
    log.info("sources_seeded", count=len(SEEDS))
