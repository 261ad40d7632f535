"""``ppf lab churn``: the churn lab, standing, for a person or a benchmark to point at."""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ops.lab.churn import MAX_SPEED, PROFILES

    lab = sub.add_parser("lab", help="labs in the world in a box (root)")
    kinds = lab.add_subparsers(dest="lab_kind", required=True)
    churn = kinds.add_parser(
        "churn",
        help="proxies that die and come back on a seeded schedule",
        description="N real proxies (microsocks, tinyproxy) on public-looking addresses "
        "in a network namespace, dying (refusing, silent, tarpit) and coming back as "
        "the profile's seeded schedule says; time runs SPEED times fast. Prints where "
        "things are, as JSON, then holds until Ctrl-C; the box is removed on exit.",
    )
    churn.add_argument("--proxies", type=int, default=200)
    churn.add_argument("--profile", choices=sorted(PROFILES), default="steady")
    churn.add_argument("--seed", type=int, default=1)
    churn.add_argument("--speed", type=float, default=1.0, help=f"1 to {MAX_SPEED}")
    churn.add_argument("--duration", type=int, default=3_600, help="simulated seconds")
    churn.set_defaults(run=run_churn)


def run_churn(args: argparse.Namespace) -> int:
    from ops.lab.churn import MAX_SPEED, plan
    from ops.lab.world import World, unavailable

    if why := unavailable():
        print(f"ppf lab churn: {why}")
        return 2
    if not 1 <= args.speed <= MAX_SPEED:
        print(f"ppf lab churn: --speed {args.speed}: 1 to {MAX_SPEED}")
        return 2
    try:
        schedule = plan(args.profile, args.proxies, args.seed, args.duration)
    except ValueError as exc:
        print(f"ppf lab churn: {exc}")
        return 2
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with (
        tempfile.TemporaryDirectory(prefix="ppf-churn-") as tmp,
        World(Path(tmp), churn=schedule, speed=args.speed) as world,
    ):
        where = {
            "page": world.churn_page_url,
            "judges": world.judges,
            "proxies": len(schedule.servers),
            "profile": args.profile,
            "speed": args.speed,
            "t0": world.churn_t0,
            "ends_at": world.churn_t0 + schedule.duration_ms / 1000 / args.speed,
        }
        print(json.dumps(where), flush=True)
        try:
            while not done.wait(1.0):  # a timed wait: Ctrl-C gets through
                pass
        except KeyboardInterrupt:
            pass
    return 0
