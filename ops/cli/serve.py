"""``ppf up``, ``ppf gateway``, ``ppf fold``: the long-running roles.

Each command is composed from small start functions (ops/cli/services.py) that push
their own cleanup onto one ``AsyncExitStack``, so what started is stopped in reverse
order, whatever failed.
"""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path

import structlog

from endpoint.router.outcomes import Outcomes
from gateway.judge import JudgeDoor, JudgeKeys, enrolled_in
from ops.cli.common import DEFAULT_NATS, StopSignals, data_dir, holding, listen
from ops.cli.endpoint import DEFAULT_SERVE, endpoint_site, serve_options
from ops.cli.judges import agent_judges, judge_site, tls_judge_site
from ops.cli.local import enroll_local_agents, local_agents
from ops.cli.services import (
    configure,
    fold_service,
    gateway_options,
    gateway_site,
    nats_server,
    open_log,
    seed_sources,
    serve_forever,
    store_options,
)
from ops.cli.snapshots import snapshot_options

__all__ = ["register"]

log = structlog.get_logger("ppf")


def never_probe_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--never-probe",
        action="append",
        default=[],
        metavar="SITE",
        help="a site (its registrable domain) the fleet's checkers never probe; repeatable",
    )


def replicas_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help=f"replicas of the stream and the buckets, moved to N if they have fewer ({default})",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="the whole system on one machine")
    up.add_argument("--data", default=None, help="default: $PPF_DATA or ./data")
    up.add_argument("--listen", default="127.0.0.1:8080", type=listen)
    up.add_argument("--nats-listen", default="127.0.0.1:4222", type=listen)
    up.add_argument("--nats", default=None, help="use this NATS; start none")
    up.add_argument(
        "--cluster",
        type=int,
        default=1,
        metavar="N",
        help="start N NATS nodes, clustered, on --nats-listen's port and the N-1 after it",
    )
    replicas_option(up, "default: --cluster's N")
    up.add_argument(
        "--no-agents", action="store_true", help="start no local agents (workers, checkers)"
    )
    up.add_argument(
        "--no-seed", action="store_true", help="start with no sources (no built-in lists)"
    )
    up.add_argument("--lab", action="store_true", help="accept loopback and private addresses")
    up.add_argument("--private-queries", action="store_true", help="queries need a token")
    never_probe_option(up)
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
        "--serve-listen",
        default=DEFAULT_SERVE,
        help="the rotating proxy endpoint (HTTP, CONNECT, SOCKS5; consumers log in with "
        "NAME[-options]:TOKEN); 'off' for none",
    )
    serve_options(up)
    snapshot_options(up, every=1_000_000, trim=True)
    store_options(up, deposits=True, disk=True)
    gateway_options(up)
    up.set_defaults(run=_up)

    gw = sub.add_parser("gateway", help="the HTTP gateway alone")
    gw.add_argument("--nats", default=DEFAULT_NATS)
    replicas_option(gw, "default: the stream's own")
    gw.add_argument("--listen", default="127.0.0.1:8080", type=listen)
    gw.add_argument("--private-queries", action="store_true", help="queries need a token")
    never_probe_option(gw)
    gw.add_argument(
        "--judge-key",
        default=None,
        metavar="FILE",
        help="the fleet's judge secret (a ppf up data dir's judge.key; made when missing), "
        "so agents' keys hold at every gateway; without it this gateway makes its own",
    )
    snapshot_options(gw, every=0, trim=False)
    store_options(gw, deposits=False, disk=True)
    gateway_options(gw)
    gw.set_defaults(run=_gateway)

    fo = sub.add_parser("fold", help="the fold alone: projections to DuckDB, DLQ")
    fo.add_argument("--nats", default=DEFAULT_NATS)
    replicas_option(fo, "default: the stream's own")
    fo.add_argument("--data", default=None, help="default: $PPF_DATA or ./data")
    snapshot_options(fo, every=1_000_000, trim=False)
    store_options(fo, deposits=True, disk=False)
    fo.set_defaults(run=_fold)


async def _up(args: argparse.Namespace) -> int:
    stop = StopSignals()
    data = data_dir(args)
    async with AsyncExitStack() as stack:
        stack.enter_context(holding(data))  # before anything is started or published
        server = await nats_server(stack, args, data)
        url = server.url if server else args.nats or DEFAULT_NATS
        lg = await open_log(stack, url, "ppf-up", args.replicas or args.cluster)
        await configure(lg, args.lab)
        tokens = {} if args.no_agents else await enroll_local_agents(lg)
        fold = await fold_service(stack, lg, data, dlq=True, args=args)
        agent_nats = server.agent_auth() if server is not None else None
        # Every judge ppf opens answers its agents' checks only, signed (gateway/judge.py).
        keys = JudgeKeys.load(data / "judge.key")
        door = JudgeDoor(keys, enrolled_in(lambda: fold.state))
        store = data / "nats" if server is not None else None  # an outside NATS: not ours
        outcomes = Outcomes()
        base = await gateway_site(stack, args, fold, lg, agent_nats, "up", door, store, outcomes)
        (data / "gateway").write_text(base + "\n")  # ppf check beside it asks its judge
        tls_judge = None
        if args.judge_tls_listen != "off":
            certs = data / "tls"
            tls_judge = await tls_judge_site(stack, args.judge_tls_listen, certs, door)
        if args.judge_listen is not None:
            await judge_site(stack, args.judge_listen, door)
        judges, own = agent_judges(args, base)
        # Caught up first: the local agents' tokens must be in the projection before they
        # ask the gateway, and an empty log tells a first start.
        await fold.wait_for(await lg.head_seq(), 30)
        if not args.lab and not args.no_seed and not fold.state.sources:
            await seed_sources(lg)
        if tokens:
            print(f"ppf up: the local agents check through {', '.join(judges)}", flush=True)
            await local_agents(stack, base, tokens, data, judges, own, args, tls_judge, keys)
        if args.serve_listen != "off":
            identity = ("local-endpoint", tokens["local-endpoint"]) if tokens else None
            await endpoint_site(
                stack, args.serve_listen, [base], args, outcomes, required=False, identity=identity
            )
        log.info("started", role="up", nats=lg.address)
        await serve_forever(fold, stop)
    return 0


async def _gateway(args: argparse.Namespace) -> int:
    stop = StopSignals()
    async with AsyncExitStack() as stack:
        lg = await open_log(stack, args.nats, "ppf-gateway", args.replicas)
        # A replica without a data dir: its projection lives in memory; its digest is
        # kept by a checkpoint writer on an in-memory database (see projections.live).
        fold = await fold_service(stack, lg, None, dlq=False, args=args)
        store = Path(args.store_disk) if args.store_disk else None
        door = None
        if args.judge_key is not None:  # the fleet's judge secret, shared with ppf up's
            door = JudgeDoor(JudgeKeys.load(Path(args.judge_key)), enrolled_in(lambda: fold.state))
        await gateway_site(stack, args, fold, lg, None, "gateway", door, store=store)
        log.info("started", role="gateway", nats=lg.address)
        await serve_forever(fold, stop)
    return 0


async def _fold(args: argparse.Namespace) -> int:
    stop = StopSignals()
    data = data_dir(args)
    async with AsyncExitStack() as stack:
        stack.enter_context(holding(data))
        lg = await open_log(stack, args.nats, "ppf-fold", args.replicas)
        fold = await fold_service(stack, lg, data, dlq=True, args=args)
        print(f"ppf fold: nats {lg.address}  db {data / 'ppf.duckdb'}", flush=True)
        log.info("started", role="fold", nats=lg.address)
        await serve_forever(fold, stop)
    return 0
