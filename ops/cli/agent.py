"""``ppf agent``, ``ppf check``, ``ppf extract``, ``ppf geo``: the fleet's work, run by hand
or as a role."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import structlog

from events.wire import DEFAULT_LEASE_TTL_S, SEED_LEASE_TTL_S
from ops.cli.common import StopSignals

__all__ = ["register"]

# What `ppf check --json` prints of a check (docs/architecture.md §9).

log = structlog.get_logger("ppf")


def _seconds(text: str) -> int:
    """argparse type: a whole number of seconds, at least one (the fleet's settings clamp
    a lease's TTL further, to lease_ttl_min_s and lease_ttl_max_s)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: a lease lasts at least a second")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser("extract", help="proxy candidates in a list, one a line")
    ex.add_argument("file", help="a file, or - for stdin")
    ex.add_argument("--hint", default=None, help="protocol of the list (http, socks4, socks5)")
    ex.add_argument("--json", action="store_true")
    ex.add_argument("--lab", action="store_true", help="accept loopback and private addresses")
    ex.set_defaults(run=_extract)

    ag = sub.add_parser("agent", help="run an agent against a gateway")
    ag.add_argument("role", choices=["worker", "checker", "seed"], help="what the agent does")
    ag.add_argument(
        "--gateway",
        required=True,
        help="gateway URL(s), comma-separated: the agent moves to the next when one goes",
    )
    ag.add_argument(
        "--token",
        default=os.environ.get("PPF_TOKEN"),
        help="the agent's token (default: $PPF_TOKEN, which no process listing shows)",
    )
    ag.add_argument(
        "--nats", default=None, help="publish here (default: the URL the gateway offers the role)"
    )
    ag.add_argument(
        "--http-only", action="store_true", help="publish through POST /v1/events, never NATS"
    )
    ag.add_argument("--upstream", default=None, help="socks5://127.0.0.1:9050 for Tor")
    ag.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="URL",
        help="a judge (repeatable); default: the gateway's /judge and the built-in public list",
    )
    ag.add_argument(
        "--own-judge",
        action="append",
        default=[],
        metavar="URL",
        help="a judge of this fleet (repeatable), e.g. ppf up's --public-url: not held to "
        "the politeness budget of public judges (5 requests a second each)",
    )
    ag.add_argument(
        "--tls-judge", default=None, help="https://host:port/judge: tunnels are checked for MITM"
    )
    ag.add_argument(
        "--https-target",
        action="append",
        default=[],
        metavar="URL",
        help="an HTTPS endpoint with a 2xx answer (repeatable; default: a built-in list)",
    )
    ag.add_argument("--lab", action="store_true", help="fetch and check private addresses")
    ag.add_argument("--data", default="./data/agents", help="outbox directory")
    ag.add_argument("--batch", type=int, default=5, help="sources leased a cycle")
    ag.add_argument("--check-timeout", type=float, default=5.0, help="seconds a check may take")
    ag.add_argument(
        "--deposit-pages-max",
        type=int,
        default=1024 * 1024,
        help="worker: keep changed pages up to this many bytes for ppf reparse (0: none)",
    )
    ag.add_argument("--seed-batch", type=int, default=200, help="seed: items a deposit")
    ag.add_argument(
        "--per-net", type=float, default=20.0, help="seed: checks a second into one /24"
    )
    ag.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="CIDR",
        help="seed: never check these addresses (repeatable; private ones never are)",
    )
    ag.add_argument(
        "--lease-ttl",
        type=_seconds,
        default=None,
        help="seconds a lease is held unheard (heartbeats and idle asks come a third of it"
        f" apart; default {SEED_LEASE_TTL_S} for a seed range, {DEFAULT_LEASE_TTL_S} else)",
    )
    exempt = "never inside a container"
    for flag, what in (
        ("--on-battery", f"while on its battery (never without one, {exempt})"),
        ("--on-metered", f"while its link is metered (as NetworkManager says, {exempt})"),
    ):
        ag.add_argument(
            flag,
            choices=["pause", "work"],
            default="pause",
            help=f"{what}: take no new work (default), or work on",
        )
    ag.set_defaults(run=_agent)

    geo = sub.add_parser("geo", help="offline country and network of addresses")
    geo.add_argument("ips", nargs="+", metavar="IP")
    geo.add_argument("--json", action="store_true")
    geo.set_defaults(run=_geo)


def _geo(args: argparse.Namespace) -> int:
    from projections.locator import lookup

    for ip in args.ips:
        place = lookup(ip)
        row = {"ip": ip, "country": place.country, "as_org": place.as_org, "geo": place.geo}
        print(json.dumps(row) if args.json else f"{ip} {place.country or '-'} {place.as_org}")
    return 0


def _extract(args: argparse.Namespace) -> int:
    from agents.extract import EXTRACTOR, extract

    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    out = sys.stdout
    for c in extract(data, args.hint, lab=args.lab):
        if args.json:
            row = {"ip": c.ip, "port": c.port, "proto": c.proto, "confidence": c.confidence}
            out.write(json.dumps(row) + "\n")
        else:
            out.write(f"{c}\n")
    log.debug("extracted", extractor=EXTRACTOR, file=args.file)
    return 0


async def _agent(args: argparse.Namespace) -> int:
    if not args.token:
        print("ppf agent: a token is needed: --token or $PPF_TOKEN", file=sys.stderr)
        return 2
    signals = StopSignals()
    from agents.checker import Checker, CheckerConfig
    from agents.gateway_client import GatewayClient, GatewayError
    from agents.seednode import SeedConfig, SeedNode
    from agents.worker import Worker, WorkerConfig

    data = Path(args.data)
    try:
        # Only to learn the agent's name: it publishes nothing, so it asks for no NATS.
        outbox = data / "outbox.jsonl"
        async with GatewayClient(args.gateway, args.token, "", outbox, http_only=True) as gw:
            me = await gw.whoami()
    except (GatewayError, OSError) as exc:
        print(f"ppf agent: {exc}", file=sys.stderr)
        return 1
    from agents.citizen import Citizen
    from agents.https import HTTPS_TARGETS
    from agents.judgepool import BUILTIN_JUDGES

    gateway_judge = args.gateway.split(",")[0].strip().rstrip("/") + "/judge"
    given = [*args.judge, *args.own_judge]
    judges = given or [gateway_judge, *BUILTIN_JUDGES]
    own = tuple(args.own_judge) if given else (gateway_judge,)
    https = tuple(args.https_target) or (() if args.lab else HTTPS_TARGETS)
    # What every role is told alike (agents/loop.py AgentConfig).
    common: dict[str, Any] = {
        "check_timeout_s": args.check_timeout,
        "nats": args.nats,
        "http_only": args.http_only,
        "tls_judge": args.tls_judge,
        "own_judges": own,
        "https_targets": https,
        "judge_key": me.judge_key,
        "citizen": Citizen(battery=args.on_battery, metering=args.on_metered),
        **({} if args.lease_ttl is None else {"lease_ttl_s": args.lease_ttl}),
    }
    agent: Worker | Checker | SeedNode
    if args.role == "seed":
        seeding = SeedConfig(
            lab=args.lab,
            upstream=args.upstream,
            batch=args.seed_batch,
            per_net_per_s=args.per_net,
            exclude=tuple(args.exclude),
            **common,
        )
        agent = SeedNode(args.gateway, args.token, me.name, judges, data / me.name, seeding)
    elif args.role == "worker":
        config = WorkerConfig(
            lab=args.lab,
            upstream=args.upstream,
            batch=args.batch,
            deposit_pages_max=args.deposit_pages_max,
            **common,
        )
        agent = Worker(args.gateway, args.token, me.name, judges, data / me.name, config)
    else:
        checks = CheckerConfig(**common)
        agent = Checker(args.gateway, args.token, me.name, judges, data / me.name, checks)
    log.info("agent_started", agent=me.name, role=me.role, gateway=args.gateway)
    try:
        await agent.run(signals.serving())
    except (OSError, ValueError, TimeoutError) as exc:  # the judges, asked at start
        print(f"ppf agent: cannot start: {exc!r}", file=sys.stderr)
        return 1
    return 0
