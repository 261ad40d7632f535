"""``ppf bench check``: checks per second through the real proxy lab, and memory.

The judge runs in its own process (an async aiohttp app: a threaded judge capped
checks at 450-500/s on this machine), the proxies in theirs, the checks here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.check import Judge, check_many
from gateway.judge import JudgeKeys
from ops.bench.options import Check
from ops.lab.testbed import ProxyLab, self_signed
from ops.nats.server import free_port

__all__ = ["bench_check"]

# The judge, plain on argv[1] and, given a certificate, over TLS on argv[2]; its key in
# the file $PPF_BENCH_JUDGE_KEY, the checks minted as the operator (gateway/judge.py).
_JUDGE = """
import asyncio, os, ssl, sys
from pathlib import Path
from aiohttp import web
from gateway.app import judge
from gateway.guard import listen
from gateway.judge import JUDGE_DOOR, JudgeDoor, JudgeKeys

async def main():
    app = web.Application()
    app[JUDGE_DOOR] = JudgeDoor(JudgeKeys.load(Path(os.environ["PPF_BENCH_JUDGE_KEY"])))
    app.router.add_get("/judge", judge)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await listen(runner, "127.0.0.1", int(sys.argv[1]))
    if len(sys.argv) > 2:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
        await listen(runner, "127.0.0.1", int(sys.argv[2]), ctx)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _judge_up(port: int, tls_port: int | None, key: Path) -> Judge:
    tls_url = f"https://127.0.0.1:{tls_port}/judge" if tls_port else None
    signer = JudgeKeys.load(key).operator()
    for _ in range(200):
        with contextlib.suppress(OSError, ValueError, TimeoutError):
            return await Judge.discover(
                f"http://127.0.0.1:{port}/judge", timeout=2, tls_url=tls_url, signer=signer
            )
        await asyncio.sleep(0.05)
    raise RuntimeError("the judge did not start")


async def bench_check(check: Check) -> dict[str, Any]:
    """With ``tls``, the tunnels (SOCKS here) carry TLS to a pinned judge, as an agent
    given ``--tls-judge`` does: the cost of watching for interception."""
    checks, tls = check.checks, check.tls
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 5,000 sockets at once
    with tempfile.TemporaryDirectory(prefix="ppf-bench-check-") as tmp:
        lab = ProxyLab(Path(tmp) / "lab").start()
        port = free_port()
        argv = [str(port)]
        tls_port = free_port() if tls else None
        if tls_port:
            argv += [str(tls_port), *map(str, self_signed(Path(tmp), "judge"))]
        key = Path(tmp) / "judge-secret"  # judge.key is its certificate's
        JudgeKeys.load(key)
        judge_proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _JUDGE, *argv, env={**os.environ, "PPF_BENCH_JUDGE_KEY": str(key)}
        )
        try:
            judge = await _judge_up(port, tls_port, key)
            # tinyproxy answers nothing past its few hundred clients (its own limit, seen
            # as failed checks at 5,000 at once), so the load goes to the three that hold.
            working = [p for p in lab.proxies if p.name in ("squid", "microsocks", "dante")]
            targets = [
                ("127.0.0.1", working[i % len(working)].port, working[i % len(working)].proto)
                for i in range(checks)
            ]
            out: dict[str, Any] = {
                "checks": checks,
                "proxies": [p.name for p in working],
                "tls_judge": judge.tls is not None,
            }
            for concurrency in (500, 5_000):
                t = time.perf_counter()
                results = await check_many(targets, judge, concurrency=concurrency, timeout=10)
                elapsed = time.perf_counter() - t
                ok = sum(r.ok for r in results)
                out[f"c{concurrency}_checks_per_s"] = round(checks / elapsed)
                out[f"c{concurrency}_ok"] = ok
                out[f"c{concurrency}_peak_rss_mb"] = round(_rss_mb())
                errors: dict[str, int] = {}
                names = {p.port: p.name for p in working}
                for (_, port, _), r in zip(targets, results, strict=True):
                    if not r.ok:
                        why = f"{names[port]}: {r.error[:60]}"
                        errors[why] = errors.get(why, 0) + 1
                out[f"c{concurrency}_errors"] = errors
        finally:
            judge_proc.terminate()
            await judge_proc.wait()
            lab.stop()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return out
