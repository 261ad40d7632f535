"""``ppf up`` beside the world in a box, as the world benchmarks run it: its defaults,
no lab mode, its own judge given to the world on the link address, the box's public
judges and HTTPS endpoint named; stopped with Ctrl-C's signal, killed if it hangs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.lab.world import LINK_HOST, World
from ops.nats.server import free_port, with_credentials

__all__ = ["UpBeside", "answers", "get_json", "up_beside"]


@dataclass(frozen=True, slots=True)
class UpBeside:
    proc: subprocess.Popen[bytes]
    base: str  # the API, http://127.0.0.1:PORT
    nats_port: int
    data: Path
    log: Path
    judge_url: str  # its judge, where the world reaches it (--public-url)

    @property
    def nats_url(self) -> str:
        """The embedded server's URL, with the service's credentials."""
        return with_credentials(f"nats://127.0.0.1:{self.nats_port}", self.data / "nats")

    async def started(self, timeout_s: float = 60.0) -> None:
        """Until its gateway answers; an error with the log's tail when it does not."""
        began = time.monotonic()
        while not answers(self.base):
            if self.proc.poll() is not None or time.monotonic() - began > timeout_s:
                raise RuntimeError(f"ppf up did not start:\n{self.log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)

    async def add_source(self, url: str) -> None:
        """``ppf sources add URL``, as an operator would."""
        add = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ops.cli", "sources", "add", url, "--nats", self.nats_url,
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        if await add.wait() != 0:
            raise RuntimeError("ppf sources add failed")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def answers(base: str) -> bool:
    """Whether the gateway at ``base`` is up."""
    with contextlib.suppress(OSError, ValueError):
        return bool(get_json(base + "/healthz")["ok"])
    return False


@contextlib.contextmanager
def up_beside(world: World, root: Path, *extra: str) -> Iterator[UpBeside]:
    http, judge, tls, nats = free_port(), free_port(), free_port(), free_port()
    data = root / "data"
    cmd = [sys.executable, "-m", "ops.cli", "up", "--data", str(data)]
    cmd += ["--listen", f"127.0.0.1:{http}", "--nats-listen", f"127.0.0.1:{nats}"]
    cmd += ["--serve-listen", f"127.0.0.1:{free_port()}"]
    cmd += ["--no-seed", "--https-target", world.https_url]
    cmd += ["--public-url", f"http://{LINK_HOST}:{judge}/judge"]
    cmd += ["--judge-listen", f"{LINK_HOST}:{judge}"]
    cmd += ["--judge-tls-listen", f"{LINK_HOST}:{tls}"]
    cmd += ["--judge", world.judges["httpbin"], "--judge", world.judges["azenv"], *extra]
    log = root / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
    try:
        judge_url = f"http://{LINK_HOST}:{judge}/judge"
        yield UpBeside(proc, f"http://127.0.0.1:{http}", nats, data, log, judge_url)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
