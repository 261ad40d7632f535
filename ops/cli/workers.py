"""``ppf serve --workers N`` (``ppf up --serve-workers N``): N endpoint processes on one
port, fed by one feed.

Each worker is ``ppf serve --worker`` in its own interpreter, listening on the same
address with ``SO_REUSEPORT`` (the kernel spreads the connections among them; Linux
lets only the same user's sockets share the port); its feed asks this process
(endpoint/share.py), which asks the gateways once for all of them. A worker that exits
is started again after a second; stopping ends them all (SIGTERM, then SIGKILL after
10 s). What one worker learns of an upstream and of a site stays its own, as do its
connection limits and its counts (docs/architecture.md, the ppf serve row).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
from contextlib import AsyncExitStack

import structlog

from endpoint.share import SECRET_HEADER, Shared
from ops.cli.common import stop_step
from ops.nats.server import free_port

__all__ = ["SECRET_ENV", "TOKEN_ENV", "start_workers", "worker_headers"]

log = structlog.get_logger("ppf")

SECRET_ENV = "PPF_SERVE_SECRET"  # what a worker shows its endpoint's feed
TOKEN_ENV = "PPF_SERVE_TOKEN"  # the endpoint's own token (an argument would show in ps)
_READY = b"ppf: proxy endpoint"


def worker_headers() -> dict[str, str]:
    """What a worker's feed sends on every call (``--worker``)."""
    return {SECRET_HEADER: os.environ.get(SECRET_ENV, "")}


async def start_workers(
    stack: AsyncExitStack,
    listen_at: str,
    gateways: list[str],
    args: argparse.Namespace,
    identity: tuple[str, str] | None,
) -> Shared | None:
    """``args.serve_workers`` workers listening on ``listen_at``, and their feed; None
    when one could not listen (the port is another program's), none left running."""
    secret = secrets.token_urlsafe(24)
    shared = Shared(gateways, args.serve_refresh, secret)
    url = await shared.start(free_port())
    stop_step(stack, "the shared asks", shared.stop)
    argv = [sys.executable, "-m", "ops.cli", "serve", "--worker", "--gateway", url]
    argv += ["--listen", listen_at, "--serve-max-conns", str(args.serve_max_conns)]
    argv += ["--serve-refresh", str(args.serve_refresh), "--serve-hedges", str(args.serve_hedges)]
    argv += ["--lab"] if args.lab else []
    argv += ["--name", identity[0]] if identity else []
    env = {**os.environ, SECRET_ENV: secret, **({TOKEN_ENV: identity[1]} if identity else {})}
    group = _Workers(argv, env)
    stop_step(stack, "the workers", group.stop)
    for _ in range(args.serve_workers):
        if not await group.add():
            return None
    group.watch()
    return shared


class _Workers:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.procs: list[asyncio.subprocess.Process] = []
        self.stopping = False
        self.drains: set[asyncio.Future[None]] = set()
        self._watch: asyncio.Task[None] | None = None

    async def add(self, index: int | None = None) -> bool:
        """One worker started, once it listens; False when it exited first."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv, env=self.env, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(60):
                while line := await proc.stdout.readline():
                    if line.startswith(_READY):
                        break
        except TimeoutError:
            line = b""
        if not line:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return False
        drain = asyncio.ensure_future(_drain(proc.stdout))
        self.drains.add(drain)
        drain.add_done_callback(self.drains.discard)
        if index is None:
            self.procs.append(proc)
        else:
            self.procs[index] = proc
        return True

    def watch(self) -> None:
        self._watch = asyncio.ensure_future(self._again())

    async def _again(self) -> None:
        """A worker that exits is started again (after a second: one that cannot start
        does not spin)."""
        while not self.stopping:
            waits = {asyncio.ensure_future(p.wait()): i for i, p in enumerate(self.procs)}
            done, pending = await asyncio.wait(waits, return_when="FIRST_COMPLETED")
            for task in pending:
                task.cancel()
            for task in done:
                if self.stopping:
                    return
                i = waits[task]
                log.warning("serve_worker_exited", worker=i, code=task.result())
                await asyncio.sleep(1)
                if not await self.add(i):
                    log.warning("serve_worker_not_restarted", worker=i)

    async def stop(self) -> None:
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(out: asyncio.StreamReader) -> None:
    """A worker's stdout after it listened: passed on, so it never fills its pipe."""
    while line := await out.readline():
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
