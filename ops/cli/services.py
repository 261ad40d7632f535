"""The start functions ``ppf up``, ``ppf gateway`` and ``ppf fold`` are composed of
(ops/cli/serve.py): each starts one part and pushes its cleanup onto the command's
``AsyncExitStack``. Also the options of the deposit store and the disk they share."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import structlog

from agents.outbox import OUTBOX_REPLAY_S
from eventlog.client import Log
from eventlog.waiting import START_WAIT_S
from events import Settings
from events.address import ADDRESS_RULE
from gateway.guard import GuardedRunner, listen
from gateway.judge import JudgeDoor
from gateway.natsauth import NatsAuth
from ops.cli.admin import reconfigure
from ops.cli.common import StopSignals, hostport, port_taken, stop_step
from ops.cli.local import LOCAL_AGENTS
from ops.cli.snapshots import snapshots_for
from ops.collector import collect_young, for_folding, freeze_projections, freeze_state
from ops.nats.cluster import LocalCluster
from ops.nats.server import NatsServer, PortInUse
from projections.live import FoldService
from projections.locator import Locator

__all__ = [
    "configure",
    "fold_service",
    "gateway_site",
    "nats_server",
    "open_log",
    "seed_sources",
    "serve_forever",
    "store_options",
]

log = structlog.get_logger("ppf")


def gateway_options(parser: argparse.ArgumentParser) -> None:
    """What every gateway is told about the network in front of it."""
    parser.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        type=_network,
        metavar="ADDR",
        help="a reverse proxy in front of the gateway (address or network, repeatable): "
        "only from these is X-Forwarded-For believed for the client's address",
    )


def _network(text: str) -> str:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an address or network: {text!r}") from None
    return text


def store_options(parser: argparse.ArgumentParser, *, deposits: bool, disk: bool) -> None:
    """Retention of deposits (where a fold ingests them) and the disk budget guard
    (where a gateway grants seed leases)."""
    if deposits:
        parser.add_argument(
            "--deposit-max-age-days",
            type=float,
            default=30.0,
            help="deposits (raw pages, seed batches) are deleted this long after their "
            "last deposit",
        )
        parser.add_argument(
            "--deposit-max-gb",
            type=float,
            default=20.0,
            help="the deposits kept in all; past it the oldest are deleted first",
        )
        parser.add_argument(
            "--reconcile-deposits",
            action="store_true",
            help="once a day, list the deposit store against the log (counted, reported)",
        )
    if disk:
        parser.add_argument(
            "--disk-share",
            type=_share,
            default=0.8,
            help="bulk imports (seed leases, planning) pause while the deposit store or the "
            "log holds more than this share of the store's disk",
        )
    if disk and not deposits:  # ppf gateway: the store may be another machine's
        parser.add_argument(
            "--store-disk",
            default=None,
            metavar="DIR",
            help="a directory on the disk the NATS store is on, weighed for --disk-share "
            "(default: no guard)",
        )


async def serve_forever(fold: FoldService, stop: StopSignals) -> None:
    freeze_projections(fold.state)
    await stop.wait()


async def nats_server(
    stack: AsyncExitStack, args: argparse.Namespace, data: Path
) -> NatsServer | LocalCluster | None:
    """The embedded server (``--cluster N``: N nodes from ``--nats-listen``'s port on),
    unless ``--nats`` names one."""
    if args.nats is not None:
        return None
    host, port = hostport(args.nats_listen, 4222)
    server: NatsServer | LocalCluster = NatsServer(data / "nats", host, port)
    if args.cluster > 1:
        ports = [port + i for i in range(args.cluster)]
        server = LocalCluster(data / "nats", args.cluster, host, ports)
    try:  # another NATS on the port would pass for ours: said, not used
        await server.astart()
    except PortInUse as exc:
        raise port_taken(exc.host, exc.port, "--nats-listen") from None
    stop_step(stack, "nats-server", server.astop)
    return server


async def open_log(stack: AsyncExitStack, url: str, name: str, replicas: int | None = None) -> Log:
    lg = await Log.connect(url, name=name, wait_s=START_WAIT_S)
    lg.replicas = replicas
    stop_step(stack, "the log client", lg.close)
    await lg.ensure_stream()
    return lg


RESEND_WINDOW = 512  # ids each agent's re-send mark keeps (reducers/marks.py)
# The re-send window in log time (reducers/marks.py): what an agent's outbox may still
# send (OUTBOX_REPLAY_S after its id's date) reaches the log within that plus the skew
# its clock may have (``id_skew_s``): past both, nothing honest comes again.
RESEND_WINDOW_S = OUTBOX_REPLAY_S + Settings().id_skew_s


async def configure(lg: Log, lab: bool) -> None:
    """Publish ``Configured`` when the log's last settings disagree with ``--lab`` or
    predate what ``ppf up`` runs with: per-agent subjects (docs/architecture.md §5);
    trust, the local agents the operator's own (reducers/trust.py); a re-send window
    per agent (reducers/marks.py), check rounds as one message each (events/batches.py),
    the guarded rules (events/catalogue.py Settings), the newest address rule, sites'
    cells kept for the trusted and evicted, verdicts charged each and kept to targets."""
    local = tuple(name for name, _ in LOCAL_AGENTS)

    def change(s: Settings) -> Settings:
        trusted = (*s.trusted_agents, *(n for n in local if n not in s.trusted_agents))
        return msgspec.structs.replace(
            s,
            lab=lab,
            agent_subjects=True,
            trust=True,
            trusted_agents=trusted,
            resend_window=s.resend_window or RESEND_WINDOW,
            resend_window_s=s.resend_window_s or RESEND_WINDOW_S,
            batches=True,
            guarded=True,
            address_rule=max(s.address_rule, ADDRESS_RULE),
            quality=True,
            site_cells_guarded=True,
            site_eviction=True,
            verdicts_guarded=True,
        )

    if await reconfigure(lg, change) is not None:
        on = "agent_subjects trust batches guarded quality site_* verdicts_guarded"
        log.info("settings_published", lab=lab, on=on, address_rule=ADDRESS_RULE)


async def fold_service(
    stack: AsyncExitStack,
    lg: Log,
    data: Path | None,
    *,
    dlq: bool,
    args: argparse.Namespace | None = None,
) -> FoldService:
    from ops.telemetry.tap import Tap, TapConfig

    for_folding()  # from its restore and catch-up on (ops/collector.py)
    db: Path | None = None
    tap = None
    if data is not None:
        data.mkdir(parents=True, exist_ok=True)
        db = data / "ppf.duckdb"
        config = TapConfig.from_env()
        tap = Tap(config) if config is not None else None
    snaps = snapshots_for(lg, args)
    fold = FoldService(
        lg, db=db, dlq=dlq, tap=tap, deposits=lg.deposits, between=collect_young, snapshots=snaps
    )
    freeze_state()  # its containers, restored: no collection walks them again
    await fold.start()
    stop_step(stack, "the fold", fold.stop)
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
        stop_step(stack, "the deposit ingest", ingest.stop)
    # Every replica locates what its projection has not located: the ids are
    # deterministic, so the log keeps one Located per address whoever publishes it.
    locator = Locator(fold)
    await locator.start()
    stop_step(stack, "the locator", locator.stop)
    return fold


async def gateway_site(
    stack: AsyncExitStack,
    args: argparse.Namespace,
    fold: FoldService,
    lg: Log,
    agent_nats: NatsAuth | None,
    role: str,
    door: JudgeDoor | None = None,
    store: Path | None = None,
    outcomes: object = None,
) -> str:
    """The HTTP API; returns its base URL. ``agent_nats``: the embedded server, whose
        logins this gateway decides, so each agent gets its own (an external NATS's users are
        its operator's: its agents publish over HTTP). ``store``: a directory on the disk the
    NATS store is on, for the disk budget guard (None: no guard)."""
    from gateway.app import make_app
    from gateway.diskguard import DiskGuard
    from gateway.http import GatewayConfig
    from gateway.rechecks import Probing

    host, port = hostport(args.listen, 8080)
    config = GatewayConfig(
        private_queries=args.private_queries,
        probing=Probing(never=tuple(args.never_probe)),
        agent_nats=agent_nats,
        judge=door,
        trusted_proxies=tuple(args.trusted_proxy),
        # A fuzzer's many wrong tokens from one address (tests/test_api_schema.py).
        auth_failures_burst=float(os.environ.get("PPF_AUTH_FAILURES_BURST", 20)),
        endpoint_outcomes=outcomes,
        deposits=lg.deposits,
        disk_guard=None
        if store is None
        else DiskGuard(lg.stored_bytes, store, args.disk_share, _env_s("PPF_DISK_GUARD_S", 10)),
    )
    # Capped connections, headers in time (gateway/guard.py): aiohttp has neither.
    runner = GuardedRunner(make_app(fold, lg, config), access_log=None)
    await runner.setup()
    stop_step(stack, "the gateway", runner.cleanup)
    try:
        await listen(runner, host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise port_taken(host, port, "--listen") from None
        raise
    print(f"ppf {role}: gateway http://{host}:{port}  nats {lg.address}", flush=True)
    return f"http://{host}:{port}"


def _share(text: str) -> float:  # of the disk
    share = float(text)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"a share of the disk is in (0, 1], not {text}")
    return share


def _env_s(name: str, default: float) -> float:
    """A period from the environment: tests shorten the ingest's sweep (60 s) and the
    disk guard's weighing (10 s)."""
    return float(os.environ.get(name, default))


async def seed_sources(lg: Log) -> None:
    """A first start has work to do, for the local agents or remote ones: the built-in
    public lists (`ppf sources seed`). A lab starts empty."""
    from agents.seeds import SEEDS, source_added

    await lg.publish_many(source_added(dict(SEEDS), "seed"))
    log.info("sources_seeded", count=len(SEEDS))
