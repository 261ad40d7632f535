"""``ppf judges``, and the judges of ``ppf up``: which ones its agents use, and the
listeners of its own."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path

import structlog
from aiohttp import web

from gateway.guard import GuardedRunner, listen
from gateway.judge import JudgeDoor, JudgeKeys
from ops.cli.common import hostport, stop_step

__all__ = [
    "agent_judges",
    "judge_site",
    "judges_in_use",
    "local_judge",
    "operator_signer",
    "register",
    "tls_judge_site",
]

log = structlog.get_logger("ppf")


def agent_judges(args: argparse.Namespace, base: str) -> tuple[list[str], tuple[str, ...]]:
    """The judges the local agents use, and which of them are ours.

    ``--judge`` replaces the built-in public list; ``--public-url`` adds this machine's
    own judge as the world reaches it. A lab's proxies are on loopback: its judge is the
    gateway's own. (A loopback judge is only ever used for loopback proxies: the pool's
    rule, ``agents/judgepool.py``.)"""
    from agents.judgepool import BUILTIN_JUDGES

    own = [args.public_url] if args.public_url else []
    if args.lab:
        own.append(base + "/judge")
    given = list(args.judge) or ([] if args.lab else list(BUILTIN_JUDGES))
    return list(dict.fromkeys([*own, *given])), tuple(own)


def operator_signer(args: argparse.Namespace) -> tuple[str, bytes] | None:
    """How the operator's own commands (``ppf check``, ``ppf judges``) ask ppf's judges:
    nonces minted as ``OPERATOR`` with the data dir's judge key (``--data``, else
    ``$PPF_DATA``, else ``./data``); None where that dir has no key (then ppf's judges
    answer them 403, public ones as ever)."""
    from ops.cli.common import data_dir

    path = data_dir(args) / "judge.key"
    return JudgeKeys.load(path).operator() if path.exists() else None


def judges_in_use(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The judges a command here checks through, and which of them are ppf's: ``--judge``
    as given, else those of the ``ppf up`` beside the data dir (its own judge, then the
    built-in public list), as its agents check."""
    from agents.judgepool import BUILTIN_JUDGES

    if args.judge:
        return list(args.judge), list(args.judge)
    local = local_judge(args)
    own = [local] if local else []
    return [*own, *BUILTIN_JUDGES], own


def local_judge(args: argparse.Namespace) -> str | None:
    """The judge of the ``ppf up`` beside the data dir (its gateway's URL, written in
    ``gateway`` when it started), or None where none ran."""
    from ops.cli.common import data_dir

    try:
        base = (data_dir(args) / "gateway").read_text().strip()
    except OSError:
        return None
    return base + "/judge" if base else None


async def judge_site(stack: AsyncExitStack, listen_at: str, door: JudgeDoor) -> None:
    """``/judge`` alone on its own listener, so exposing the judge exposes nothing else;
    it answers only ppf's checks' nonces, signed (gateway/judge.py)."""
    from gateway.judge import JUDGE_DOOR, judge, judge_bytes

    host, port = hostport(listen_at, 8081)
    app = web.Application()
    app[JUDGE_DOOR] = door
    app.router.add_get("/judge", judge)
    app.router.add_get("/judge/bytes", judge_bytes)
    runner = GuardedRunner(app, access_log=None)  # world-facing: capped, headers timed
    await runner.setup()
    stop_step(stack, "the judge", runner.cleanup)
    await listen(runner, host, port)
    print(f"ppf up: judge http://{host}:{port}/judge", flush=True)


async def tls_judge_site(
    stack: AsyncExitStack, listen_at: str, certs: Path, door: JudgeDoor | None = None
) -> str | None:
    """``/judge`` alone over TLS, for agents that watch tunnels for interception; its URL,
    or None where openssl is missing or the port is taken (checks then see pages only)."""
    from gateway.judge import JUDGE_DOOR, judge, judge_context

    ctx = judge_context(certs)
    if ctx is None:
        log.warning("no_tls_judge", reason="openssl not found: apt-get install openssl")
        return None
    host, port = hostport(listen_at, 8443)
    app = web.Application()
    if door is not None:  # else it answers nobody
        app[JUDGE_DOOR] = door
    app.router.add_get("/judge", judge)
    runner = GuardedRunner(app, access_log=None)  # world-facing: capped, headers timed
    await runner.setup()
    stop_step(stack, "the TLS judge", runner.cleanup)
    try:
        await listen(runner, host, port, ctx)
    except OSError as exc:
        log.warning("no_tls_judge", listen=listen_at, error=repr(exc))
        return None
    url = f"https://{host}:{port}/judge"
    print(f"ppf up: TLS judge {url}", flush=True)
    return url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jd = sub.add_parser("judges", help="the judge pool, asked directly: health and latency")
    jd.add_argument(
        "--judge",
        action="append",
        default=[],
        metavar="URL",
        help="default: those of the ppf up beside the data directory (its own judge, then "
        "the built-in public list), as its agents check",
    )
    jd.add_argument("--json", action="store_true")
    jd.add_argument("--data", default=None, help="whose judge key to ask ppf's judges with")
    jd.set_defaults(run=_judges)


async def _judges(args: argparse.Namespace) -> int:
    import json

    from agents.judgepool import JudgePool

    signer = operator_signer(args)
    agent, key = signer or ("", b"")
    # ppf's own judges are asked with the operator's nonces where we have a key.
    judges, own = judges_in_use(args)
    pool = JudgePool(judges, own=own if signer else (), agent=agent, key=key)
    try:
        await pool.start(require=False)  # every judge may fail: the rows say why
    finally:
        await pool.stop()
    rows = pool.rows()
    for row in rows:
        row["own"] = row["url"] in own
        if args.json:
            print(json.dumps(row))
        else:
            state = "healthy" if row["healthy"] else f"benched ({row['last_error']})"
            whose = "ppf's own" if row["own"] else "public"
            print(f"{row['url']}  {whose}  {row['format'] or '-'}  {row['latency_ms']}ms  {state}")
    return 0 if any(r["healthy"] for r in rows) else 1
