"""``ppf agent``, ``ppf check``, ``ppf extract``, ``ppf geo``: the fleet's work, run by hand
or as a role."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import structlog

__all__ = ["register"]

# What `ppf check --json` prints of a check (ARCHITECTURE.md §9).
CHECK_KEYS = ("addr", "ok", "proto", "anonymity", "exit_ip", "latency_ms", "mitm", "error")

log = structlog.get_logger("ppf")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser("extract", help="proxy candidates in a list, one a line")
    ex.add_argument("file", help="a file, or - for stdin")
    ex.add_argument("--hint", default=None, help="protocol of the list (http, socks4, socks5)")
    ex.add_argument("--json", action="store_true")
    ex.add_argument("--lab", action="store_true", help="accept loopback and private addresses")
    ex.set_defaults(run=_extract)

    ag = sub.add_parser("agent", help="run an agent against a gateway")
    ag.add_argument("role", choices=["worker", "checker", "seed"])
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
    ag.add_argument("--check-timeout", type=float, default=5.0)
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
        "--lease-ttl", type=int, default=900, help="seed: seconds a range is held unheard"
    )
    ag.set_defaults(run=_agent)

    ck = sub.add_parser("check", help="check proxies through a judge, one result a line")
    ck.add_argument("addrs", nargs="+", metavar="ADDR", help="ip:port or proto://ip:port")
    ck.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="URL",
        help="http://host:port/judge (repeatable); default: the judge of the ppf up beside "
        "the data dir, if one runs, and the built-in public list",
    )
    ck.add_argument(
        "--explain",
        action="store_true",
        help="each step of each check with its outcome: passed, failed, unavailable, skipped",
    )
    ck.add_argument(
        "--https-target", default=None, metavar="URL", help="--explain: try HTTPS through it"
    )
    ck.add_argument(
        "--tls-judge", default=None, help="https://host:port/judge: tunnels are checked for MITM"
    )
    ck.add_argument("--proto", default=None, choices=["http", "https", "socks4", "socks5"])
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--concurrency", type=int, default=500)
    ck.add_argument("--timeout", type=float, default=10.0)
    ck.add_argument("--data", default=None, help="whose judge key to ask ppf's judges with")
    ck.set_defaults(run=_check)

    geo = sub.add_parser("geo", help="offline country and network of addresses")
    geo.add_argument("ips", nargs="+", metavar="IP")
    geo.add_argument("--json", action="store_true")
    geo.set_defaults(run=_geo)


def _geo(args: argparse.Namespace) -> int:
    from ops.geo import lookup

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


def _targets(addrs: list[str], default: str | None) -> list[tuple[str, int, str | None]]:
    """``ip:port`` or ``proto://ip:port`` each; ValueError names the first bad one."""
    from agents.extract import PROTOS

    targets = []
    for addr in addrs:
        scheme, sep, rest = addr.partition("://")
        proto = PROTOS.get(scheme.lower()) if sep else None
        if sep and proto is None:
            raise ValueError(f"unknown protocol in {addr!r}")
        host, _, port = (rest if sep else addr).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not ip:port or proto://ip:port: {addr!r}")
        targets.append((host.strip("[]"), int(port), proto or default))
    return targets


async def _check(args: argparse.Namespace) -> int:
    from agents.check import check_many
    from agents.judgepool import BUILTIN_JUDGES, JudgePool
    from ops.cli.judges import local_judge, operator_signer

    try:
        targets = _targets(args.addrs, args.proto)
    except ValueError as exc:
        print(f"ppf check: {exc}", file=sys.stderr)
        return 2
    # As ppf up's agents do: a pool of judges, each proxy checked through one that can
    # see it (a loopback judge only for loopback proxies: agents/judgepool.py).
    local = local_judge(args)
    given = list(args.judge) or [*([local] if local else []), *BUILTIN_JUDGES]
    agent, key = operator_signer(args) or ("", b"")
    own = args.judge or ([local] if local else [])
    pool = JudgePool(given, own=own, tls_url=args.tls_judge, agent=agent, key=key)
    try:
        await pool.start(require=True)
    except ValueError as exc:
        print(f"ppf check: {exc}", file=sys.stderr)
        return 1
    try:
        if args.explain:
            return await _explain(args, targets, pool)
        results = await check_many(
            targets, pool, concurrency=args.concurrency, timeout=args.timeout
        )
    finally:
        await pool.stop()
    for r in results:
        if args.json:
            print(json.dumps({k: v for k, v in dataclasses.asdict(r).items() if k in CHECK_KEYS}))
        elif r.ok:
            print(
                f"{r.addr} ok {r.anonymity or '-'} exit={r.exit_ip} {r.latency_ms}ms"
                + (" MITM" if r.mitm else "")
            )
        else:
            print(f"{r.addr} {'unavailable' if r.void else 'failed'} {r.error}")
    return 0 if any(r.ok for r in results) else 1


async def _explain(args: argparse.Namespace, targets: list[Any], pool: Any) -> int:
    from agents.explain import explain

    https = [args.https_target] if args.https_target else []
    passed = 0
    for ip, port, proto in targets:
        steps = await explain(ip, port, proto, pool, https, args.timeout)
        verdict = steps[-1][1]
        passed += verdict == "passed"
        if args.json:
            rows = [{"step": a, "outcome": b, "why": c} for a, b, c in steps]
            print(json.dumps({"addr": f"{ip}:{port}", "verdict": verdict, "steps": rows}))
            continue
        print(f"{ip}:{port}")
        for what, outcome, why in steps:
            print(f"  {outcome:<11} {what}: {why}")
    return 0 if passed else 1


async def _agent(args: argparse.Namespace) -> int:
    if not args.token:
        print("ppf agent: a token is needed: --token or $PPF_TOKEN", file=sys.stderr)
        return 2
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
    }
    agent: Worker | Checker | SeedNode
    if args.role == "seed":
        seeding = SeedConfig(
            lab=args.lab,
            upstream=args.upstream,
            batch=args.seed_batch,
            per_net_per_s=args.per_net,
            exclude=tuple(args.exclude),
            lease_ttl_s=args.lease_ttl,
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("agent_started", agent=me.name, role=me.role, gateway=args.gateway)
    try:
        await agent.run(stop)
    except (OSError, ValueError, TimeoutError) as exc:  # the judges, asked at start
        print(f"ppf agent: cannot start: {exc!r}", file=sys.stderr)
        return 1
    return 0
