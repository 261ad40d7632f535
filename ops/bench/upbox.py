"""``ppf up`` beside the world in a box, as the world benchmarks run it: its defaults,
no lab mode, its own judge given to the world on the link address, the box's public
judges and HTTPS endpoint named; stopped with Ctrl-C's signal, killed if it hangs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gatewayapi import Answer, GatewayApi
from ops.lab.world import LINK_HOST, World
from ops.nats.server import free_port, with_credentials

__all__ = ["Refused", "UpBeside", "answers", "gateway_json", "up_beside"]


@dataclass(frozen=True, slots=True)
class UpBeside:
    proc: subprocess.Popen[bytes]
    base: str  # the API, http://127.0.0.1:PORT
    nats_port: int
    data: Path
    log: Path
    judge_url: str  # its judge, where the world reaches it (--public-url)
    serve: str  # its rotating endpoint, 127.0.0.1:PORT
    cwd: Path | None = None  # the tree it runs from (None: this one)

    @property
    def nats_url(self) -> str:
        """The embedded server's URL, with the service's credentials."""
        return with_credentials(f"nats://127.0.0.1:{self.nats_port}", self.data / "nats")

    async def started(self, timeout_s: float = 60.0) -> None:
        """Until its gateway answers; an error with the log's tail when it does not."""
        began = time.monotonic()
        while not await answers(self.base):
            if self.proc.poll() is not None or time.monotonic() - began > timeout_s:
                raise RuntimeError(f"ppf up did not start:\n{self.log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)

    async def add_source(self, url: str) -> None:
        """``ppf sources add URL``, as an operator would."""
        await self.cli("sources", "add", url)

    async def cli(self, *argv: str) -> str:
        """``ppf ARGV --nats`` this one's, from its tree; what it printed."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ops.cli", *argv, "--nats", self.nats_url,
            stdout=asyncio.subprocess.PIPE, cwd=self.cwd,
        )  # fmt: skip
        async with asyncio.timeout(60):
            out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"ppf {' '.join(argv)} failed")
        return out.decode().strip()


class Refused(RuntimeError):
    """The gateway answered with something else than what was asked (a status, say)."""


async def gateway_json(base: str, ask: Callable[[GatewayApi], Awaitable[Answer]]) -> Any:
    """The JSON the gateway at ``base`` answers to ``ask``; ``Refused`` when it does not
    answer 200."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        answer = await ask(GatewayApi(http, base))
    if not answer.ok:
        raise Refused(f"{base}: {answer.status} {answer.text()}")
    return answer.json()


async def answers(base: str) -> bool:
    """Whether the gateway at ``base`` is up."""
    with contextlib.suppress(Refused, AttributeError, TypeError):
        return bool((await gateway_json(base, GatewayApi.healthz))["ok"])
    return False


@contextlib.contextmanager
def up_beside(world: World, root: Path, *extra: str, cwd: Path | None = None) -> Iterator[UpBeside]:
    """``ppf up`` of this tree, or of the one at ``cwd`` (another commit's checkout)."""
    http, judge, tls, nats, serve = (free_port() for _ in range(5))
    data = root / "data"
    cmd = [sys.executable, "-m", "ops.cli", "up", "--data", str(data)]
    cmd += ["--listen", f"127.0.0.1:{http}", "--nats-listen", f"127.0.0.1:{nats}"]
    cmd += ["--serve-listen", f"127.0.0.1:{serve}"]
    cmd += ["--no-seed", "--https-target", world.https_url]
    cmd += ["--public-url", f"http://{LINK_HOST}:{judge}/judge"]
    cmd += ["--judge-listen", f"{LINK_HOST}:{judge}"]
    cmd += ["--judge-tls-listen", f"{LINK_HOST}:{tls}"]
    cmd += ["--judge", world.judges["httpbin"], "--judge", world.judges["azenv"], *extra]
    log = root / "up.log"
    # Unbuffered: what it said before a stop that had to be killed is in the log.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=out, start_new_session=True, cwd=cwd, env=env
        )
    try:
        judge_url = f"http://{LINK_HOST}:{judge}/judge"
        base, endpoint = f"http://127.0.0.1:{http}", f"127.0.0.1:{serve}"
        yield UpBeside(proc, base, nats, data, log, judge_url, endpoint, cwd)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
