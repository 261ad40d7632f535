"""``ppf doctor``: what a newcomer would otherwise dig out of logs, checked from where it
runs, one line each with the fix: the data directory's lock, NATS and its stream, the
gateway, the fold's lag and the clock, the agents seen lately, the pool, the sites
learned, the endpoint, the disk. Exit 1 when anything failed."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import time
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import aiohttp

from eventlog.protocol import NatsUnreachable
from gatewayapi import GatewayApi
from ops.cli.common import DEFAULT_NATS, data_dir, hostport, port_holder

__all__ = ["register"]

SKEW_S = 5.0  # a clock this far from the gateway's misdates what this machine says
AGENT_SEEN_S = 300.0
DISK_FREE = 0.05
ASK_S = 10.0  # a gateway's answer to one question: a loaded one answers in far less


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dr = sub.add_parser("doctor", help="check a ppf up from here: one line each, with the fix")
    dr.add_argument("--data", default=None, help="the ppf up's data directory (default ./data)")
    dr.add_argument("--nats", default=DEFAULT_NATS)
    dr.add_argument(
        "--gateway", default=None, help="its URL (default: the one its data directory names)"
    )
    dr.add_argument(
        "--endpoint", default="127.0.0.1:8899", help="the rotating endpoint's HOST:PORT"
    )
    dr.add_argument("--json", action="store_true")
    # Its report says what the services' own log lines would (a NATS that does not
    # answer, retried): only warnings and errors besides it, so the report reads alone.
    dr.set_defaults(run=_doctor, log_level=logging.WARNING)


class _Report:
    def __init__(self) -> None:
        self.lines: list[dict[str, str]] = []

    def say(self, state: str, what: str, fix: str = "") -> None:
        self.lines.append({"state": state, "what": what, "fix": fix})

    @property
    def failed(self) -> bool:
        return any(line["state"] == "fail" for line in self.lines)


async def _doctor(args: argparse.Namespace) -> int:
    data, report = data_dir(args), _Report()
    _lock(data, report)
    await _nats(args.nats, report)
    base = args.gateway or _named_gateway(data)
    if base is None:
        report.say("fail", f"no gateway: {data} names none", "make up (or --gateway URL)")
    else:
        await _gateway(base.rstrip("/"), report)
    await _endpoint(args.endpoint, report)
    _disk(data, report)
    for line in report.lines:
        if args.json:
            print(json.dumps(line))
        else:
            fix = f"  -> {line['fix']}" if line["fix"] else ""
            print(f"{line['state']:4}  {line['what']}{fix}")
    return 1 if report.failed else 0


def _lock(data: Path, report: _Report) -> None:
    """Who holds ``data/ppf.lock`` (ops/cli/common.py ``holding``)."""
    try:
        import fcntl
    except ImportError:
        return
    path = data / "ppf.lock"
    if not path.exists():
        report.say("warn", f"no ppf up has run on {data}", "make up, or --data DIR")
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _lock_holder(path) or os.read(fd, 32).decode(errors="replace").strip() or "?"
        if _is_ppf(pid):
            report.say("ok", f"{data} is held by ppf (pid {pid})")
        else:
            why = f"{data} is locked by pid {pid} ({_comm(pid) or 'unknown'}), not a ppf up"
            report.say("fail", why, "stop it, or give ppf up a --data of its own")
        return
    finally:
        os.close(fd)
    report.say("fail", f"nothing runs on {data}", "start it: make up (or ppf up --data DIR)")


def _lock_holder(path: Path) -> str:
    """The pid holding a flock on ``path``, from ``/proc/locks`` (Linux; "" elsewhere)."""
    inode = os.stat(path).st_ino
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].endswith(f":{inode}"):
            return fields[4]
    return ""


def _is_ppf(pid: str) -> bool:
    """Whether ``pid`` runs ppf (its program, or python running it), by its argv."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(Path(a).name == "ppf" for a in argv[:2]) or "ops.cli" in argv[:3]


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def _nats(url: str, report: _Report) -> None:
    from eventlog.client import Log

    shown = url.split("@")[-1]
    try:
        async with asyncio.timeout(10):
            lg = await Log.connect(url, name="ppf-doctor", wait_s=2)
    except Exception as exc:  # every way a connect fails is said, not raised
        report.say("fail", f"NATS at {shown} does not answer: {_why(exc):.200}", _nats_fix(shown))
        return
    try:
        head = await lg.head_seq()
        stored, deposits = await lg.stored_bytes()
        held = f"{head} messages, {stored >> 20} MiB, deposits {deposits >> 20} MiB"
        report.say("ok", f"NATS at {shown}: the log holds {held}")
        await _limits(lg, report)
    except Exception as exc:
        report.say("fail", f"NATS at {shown} has no ppf stream: {exc!s:.120}", "start ppf up")
    finally:
        await lg.close()


def _why(exc: BaseException) -> str:
    """A failed connect's reason: no server took the connection (``Connection
    refused``), found under the wait that asked again; else the error as it is."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, NatsUnreachable):
        cause = cause.__cause__
    return cause.why if cause is not None else str(exc)


async def _limits(lg: Any, report: _Report) -> None:
    """JetStream's room for the log: the stream's own limits and the account's storage,
    warned at 90 % (past its limit JetStream refuses every publish: the fleet stops)."""
    from events.subjects import STREAM

    info, account = await lg.js.stream_info(STREAM), await lg.js.account_info()
    config, used = info.config, int(info.state.bytes)
    limit = config.max_bytes if config.max_bytes and config.max_bytes > 0 else None
    said = f"{used >> 20} of {limit >> 20} MiB" if limit else "no size limit of its own"
    near = limit is not None and used >= 0.9 * limit
    store = account.limits.max_storage if account.limits.max_storage > 0 else None
    if store is not None and account.storage >= 0.9 * store:
        near, said = (
            True,
            f"{said}; the account's store {account.storage >> 20} of {store >> 20} MiB",
        )
    report.say(
        "warn" if near else "ok",
        f"JetStream: stream {STREAM} ({getattr(config.storage, 'value', config.storage)}, "
        f"{config.num_replicas} "
        f"replica{'s' if (config.num_replicas or 1) > 1 else ''}): {said}",
        "give NATS more room: its store's disk, and the account's max_storage" if near else "",
    )


def _nats_fix(shown: str) -> str:
    _, port = hostport(shown.removeprefix("nats://").removeprefix("tls://"), 4222)
    holder = port_holder(port)
    if holder and "nats" not in holder:
        return f"port {port} is {holder}'s, not NATS: stop it, or ppf up --nats-listen"
    return "start ppf up (or give --nats the URL it listens on)"


def _named_gateway(data: Path) -> str | None:
    try:
        return (data / "gateway").read_text().strip() or None
    except OSError:
        return None


async def _gateway(base: str, report: _Report) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ASK_S)) as http:
        api = GatewayApi(http, base)
        # Its figures first, the rest only from a gateway that gave them: a port held by
        # a program that never answers costs one wait, not one a question.
        first = await api.stats()
        rest = await asyncio.gather(api.agents(), api.metrics()) if first.ok else []
    asked = [first, *rest]
    stats, agents = first.object(), (rest[0].object() if rest else {})
    wrong = next((a for a in asked if not a.ok), None)
    if wrong is not None or not stats or not agents:
        said = "no JSON figures"
        if wrong is not None:
            said = f"{wrong.status} " if wrong.status else "no answer: "
            said += wrong.text(100)
        _, port = hostport(base.split("//")[-1], 80)
        holder = port_holder(port)
        fix = f"port {port} is {holder}'s" if holder else "start it: make up"
        report.say("fail", f"the gateway at {base} does not answer as ppf's: {said}", fix)
        return
    metrics = asked[2].text(len(asked[2].body))
    date = asked[0].headers.get("Date")
    lag = int(stats.get("head_seq", 0)) - int(stats.get("applied_seq", 0))
    report.say("ok" if lag < 10_000 else "warn", f"the gateway at {base}: the fold {lag} behind")
    if date is not None:
        skew = abs(time.time() - parsedate_to_datetime(date).timestamp())
        state = "ok" if skew < SKEW_S else "warn"
        report.say(
            state,
            f"this clock is {skew:.1f} s off the gateway's",
            "" if state == "ok" else "run NTP",
        )
    now_ms = time.time() * 1000
    seen = [
        a for a in agents.get("agents", []) if now_ms - a.get("last_seen", 0) < AGENT_SEEN_S * 1000
    ]
    roles = sorted({str(a.get("role")) for a in seen if a.get("role") != "consumer"})
    if any(r in roles for r in ("worker", "checker")):
        report.say("ok", f"{len(seen)} agents seen in {AGENT_SEEN_S:.0f} s ({', '.join(roles)})")
    else:
        report.say("warn", "no worker or checker seen lately", "ppf up starts its own; ppf agent")
    down = [o for o in stats.get("outages", []) if o.get("agent") in {a.get("name") for a in seen}]
    if down:
        names = ", ".join(sorted(o["agent"] for o in down))
        cause = str(down[0].get("outage", ""))[:120]
        report.say(
            "fail",
            f"{len(down)} agent{'s' if len(down) > 1 else ''} reach no judge ({names}): {cause}",
            "their own way out is down: check its DNS and firewall, or give them --judge URL",
        )
    elif roles:
        report.say("ok", "every agent seen lately reaches a judge")
    pool = stats.get("pool", {}).get("alive", 0)
    report.say(
        "ok" if pool else "warn",
        f"the pool serves {pool} proxies",
        "" if pool else "agents fill it within minutes",
    )
    through = sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        if line.startswith("ppf_site_proxies{") and 'latest="through"' in line
    )
    report.say("ok", f"sites: {through} proxies known to get through (names: the admin's)")


async def _endpoint(where: str, report: _Report) -> None:
    host, port = hostport(where, 8899)
    try:
        async with asyncio.timeout(5):
            _, writer = await asyncio.open_connection(host, port)
        writer.close()
        report.say("ok", f"the rotating endpoint listens on {host}:{port}")
    except (OSError, TimeoutError):
        report.say(
            "warn", f"nothing listens on {host}:{port}", "ppf up --serve-listen, or --endpoint"
        )


def _disk(data: Path, report: _Report) -> None:
    usage = shutil.disk_usage(data if data.exists() else Path.cwd())
    free = usage.free / usage.total
    state = "ok" if free > DISK_FREE else "fail"
    report.say(
        state,
        f"the disk has {free:.0%} free ({usage.free >> 30} GiB)",
        "" if state == "ok" else "free some: the log stops at its limit",
    )
