"""``ppf check``: proxies checked as ppf's agents check them, one line each, or each step."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

__all__ = ["register"]

CHECK_KEYS = ("addr", "ok", "proto", "anonymity", "exit_ip", "latency_ms", "mitm", "error")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    ck.add_argument(
        "--proto",
        default=None,
        choices=["http", "https", "socks4", "socks5"],
        help="check each only as this (default: each protocol it may speak)",
    )
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--concurrency", type=int, default=500)
    ck.add_argument("--timeout", type=float, default=10.0)
    ck.add_argument("--data", default=None, help="whose judge key to ask ppf's judges with")
    ck.set_defaults(run=_check)


async def _check(args: argparse.Namespace) -> int:
    from agents.check import check_many
    from agents.explain import parse_targets
    from agents.judgepool import JudgePool
    from ops.cli.judges import judges_in_use, operator_signer

    try:
        targets = parse_targets(args.addrs, args.proto)
    except ValueError as exc:
        print(f"ppf check: {exc}", file=sys.stderr)
        return 2
    # As ppf up's agents do: a pool of judges, each proxy checked through one that can
    # see it (a loopback judge only for loopback proxies: agents/judgepool.py).
    given, own = judges_in_use(args)
    agent, key = operator_signer(args) or ("", b"")
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
