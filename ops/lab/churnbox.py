"""The churn lab's players, inside the box's namespace (run by ``inet.py``).

Each proxy of the plan (``churn.py``) is a real process (microsocks or tinyproxy) on
the namespace's loopback, exiting from its own public-looking address, with a delaying
relay on that address in front of it. The schedule is played on the wall clock, ``speed``
simulated seconds a second, and each death is the world's:

- ``refusing``: the process is killed and the relay closed: a connect is refused;
- ``silent``: the address is taken off the namespace's ``lo``: routed into the box,
  owned by nobody, dropped (the connect times out);
- ``tarpit``: the relay gives way to a listener that accepts and never answers.

Coming back undoes it (a killed process is started again). Everything here dies with
the namespace (``world.destroy`` kills what runs in it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Churn"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class _Player:
    index: int
    addr: str
    port: int
    server: str  # microsocks or tinyproxy
    rtt_ms: int
    root: Path
    rate_kb_s: int = 0  # its relay's answers at most this fast (0: as fast as they come)
    inner: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    listener: asyncio.base_events.Server | None = None

    def spawn(self) -> None:
        log = open(self.root / f"churn-{self.index}.log", "ab")  # noqa: SIM115
        if self.server == "microsocks":
            cmd = ["microsocks", "-i", "127.0.0.1", "-p", str(self.inner), "-b", self.addr]
        else:
            conf = self.root / f"churn-{self.index}.conf"
            conf.write_text(
                f"User nobody\nGroup nogroup\nPort {self.inner}\nListen 127.0.0.1\n"
                f"Bind {self.addr}\nAllow 127.0.0.0/8\nTimeout 30\nMaxClients 50\n"
                "LogLevel Error\nDisableViaHeader Yes\n"
            )
            cmd = ["tinyproxy", "-d", "-c", str(conf)]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    async def listen(self, handle: Any) -> None:
        await self.close()
        self.listener = await asyncio.start_server(handle, self.addr, self.port)

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


async def _ready(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


class Churn:
    """Plays one plan: ``start`` brings every proxy up and starts the clock (``t0``)."""

    def __init__(self, config: dict[str, Any], root: Path, relay: Any, tarpit: Any) -> None:
        self.speed = float(config["speed"])
        self.players = [
            _Player(i, p["addr"], p["port"], p["server"], p["rtt_ms"], root, p.get("rate_kb_s", 0))
            for i, p in enumerate(config["proxies"])
        ]
        self.downs = [p["downs"] for p in config["proxies"]]
        self._relay, self._tarpit = relay, tarpit
        self.t0 = 0.0
        self.applied = 0  # schedule steps played
        self.failed = 0  # of them, steps that raised (in the box's inet.log)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> float:
        for p in self.players:
            p.spawn()
        for p in self.players:
            await _ready(p.inner)
            await p.listen(self._relay(p.inner, p.rtt_ms, rate_kb_s=p.rate_kb_s))
        self.t0 = time.time()
        self._task = asyncio.create_task(self._play(), name="ppf-churn")
        return self.t0

    def _steps(self) -> list[tuple[float, int, int, str, bool]]:
        """(wall offset s, order, proxy, how, down?) in time order: a proxy's own steps
        keep their order when two fall in one instant."""
        steps = []
        for i, downs in enumerate(self.downs):
            for n, (start, end, how) in enumerate(downs):
                steps.append((start / 1000 / self.speed, 2 * n, i, how, True))
                steps.append((end / 1000 / self.speed, 2 * n + 1, i, how, False))
        return sorted(steps, key=lambda s: (s[0], s[2], s[1]))

    async def _play(self) -> None:
        for offset, _, i, how, down in self._steps():
            wait = self.t0 + offset - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                await (self._die if down else self._revive)(self.players[i], how)
            except Exception as exc:  # one proxy's failed step must not stop the play
                print(f"churn: proxy {i} {how} {'down' if down else 'up'}: {exc!r}", flush=True)
                self.failed += 1
            self.applied += 1

    async def _die(self, p: _Player, how: str) -> None:
        await p.close()
        if how == "refusing":
            p.kill()
        elif how == "silent":
            await _ip("addr", "del", f"{p.addr}/32", "dev", "lo")
        else:
            await p.listen(self._tarpit)

    async def _revive(self, p: _Player, how: str) -> None:
        await p.close()
        if how == "refusing":
            p.spawn()
            await _ready(p.inner)
        elif how == "silent":
            await _ip("addr", "add", f"{p.addr}/32", "dev", "lo")
        await p.listen(self._relay(p.inner, p.rtt_ms, rate_kb_s=p.rate_kb_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for p in self.players:
            await p.close()
            p.kill()


async def _ip(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()
