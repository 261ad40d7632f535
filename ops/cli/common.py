"""What every command group shares: defaults, argument types, the data dir, signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_NATS",
    "REPO",
    "SHARED_HELP",
    "CommandError",
    "StopSignals",
    "data_dir",
    "holding",
    "hostport",
    "listen",
    "port_holder",
    "port_taken",
    "stop_step",
    "unsaid",
    "watched_exit",
]


class _Unsaid(str):
    """A default that was not given: ``main`` replaces it with what the data dir's own
    server says it listens on (``ops.nats.server.local_address``)."""

    __slots__ = ()


DEFAULT_NATS = _Unsaid("nats://127.0.0.1:4222")


def unsaid(value: object) -> bool:
    """Whether ``value`` is a default the caller did not give."""
    return isinstance(value, _Unsaid)


REPO = Path(__file__).resolve().parents[2]

# What a flag or argument means wherever a command takes it without saying it itself:
# filled in once the parser is built (ops/cli/__init__.py), so no flag goes unexplained.
SHARED_HELP = {
    "--nats": "the NATS URL, or several comma-separated (default: where the data "
    "directory's own server listens, else nats://127.0.0.1:4222)",
    "--json": "one JSON object instead of lines of text",
    "--listen": "HOST:PORT to listen on (default %(default)s)",
    "--nats-listen": "HOST:PORT the embedded NATS listens on (default %(default)s)",
    "--keep-snapshots": "snapshots of the projections kept, the newest (default %(default)s)",
    "--gateway": "the gateway's URL (default %(default)s)",
    "--hint": "the protocol these lists hold, when they do not say (http, socks4, socks5)",
    "--concurrency": "at most this many at once (default %(default)s)",
    "--timeout": "seconds each may take (default %(default)s)",
    "--size": "items a range (default %(default)s)",
    "--priority": "larger goes first, plans taking turns (default %(default)s)",
    "--seed": "the random seed that draws the workload (default %(default)s)",
    "--proxies": "proxies in the workload (default %(default)s)",
    "--observations": "observations in the workload (default %(default)s)",
    "--seconds": "how long it runs, in seconds (default %(default)s)",
    "--checks": "checks in the workload (default %(default)s)",
    "--candidates": "candidates in the workload (default %(default)s)",
    "--working-share": "the share of them that work (default %(default)s)",
    "--sites": "sites in the workload (default %(default)s)",
    "--messages": "messages read (default %(default)s)",
    "--agents": "agents, each with its window full (default %(default)s)",
    "--window": "ids each agent's window keeps (default %(default)s)",
    "--profile": "how the lab's proxies come and go (default %(default)s)",
    "name": "the agent's name (1-64 of A-Z a-z 0-9 _ -)",
    "urls": "the lists' URLs",
    "url": "a page of the site, e.g. https://shop.example/",
    "ips": "addresses to look up",
    "shell": "the shell to complete for",
}


def data_dir(args: argparse.Namespace) -> Path:
    """``--data``, else ``$PPF_DATA``, else ``./data``: the one rule, for every command."""
    given = getattr(args, "data", None)
    return Path(given or os.environ.get("PPF_DATA") or "./data")


def hostport(text: str, default_port: int = 0) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        return text, default_port
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}") from None
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {text!r}")
    return host, number


def listen(text: str) -> str:
    """argparse type: check HOST:PORT at parse time, keep the text."""
    hostport(text)
    return text


class StopSignals:
    """SIGINT and SIGTERM as a long-running command's stop, heard from its first step.

    Made at the start, not once it serves: a process may inherit SIGINT ignored (a
    shell's background job does), and a Ctrl-C that came while it started was then lost
    (a fresh-clone run's ``ppf up`` ran on for 30 s after one, until its SIGTERM). While
    the command starts, the first signal cancels its start, as Python's own Ctrl-C
    does; once it serves, ``wait`` returns. A start that swallowed the cancel still
    stops: ``wait`` returns at once for a signal already heard."""

    def __init__(self) -> None:
        self._heard = asyncio.Event()
        self._starting: asyncio.Task[Any] | None = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._signalled)

    def _signalled(self) -> None:
        self._heard.set()
        starting, self._starting = self._starting, None
        if starting is not None:
            starting.cancel()

    def serving(self) -> asyncio.Event:
        """The stop as an event, for a command that watches it itself (an agent's
        loop): the command serves from here, and a signal only sets it."""
        self._starting = None
        return self._heard

    async def wait(self) -> None:
        """Until a signal: the command serves from here."""
        await self.serving().wait()


class CommandError(Exception):
    """What the operator can fix, said in one line (``ppf CMD: why``), exit 1, no traceback."""


@contextlib.contextmanager
def holding(data: Path) -> Iterator[None]:
    """This process alone runs on ``data`` (``ppf up``, ``ppf fold``): the lock
    ``data/ppf.lock`` (holding its pid) is taken before anything is started or
    published, and a second process is refused, touching nothing. The kernel lets the
    lock go when the process ends, however it ends."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; nothing held
        yield
        return
    data.mkdir(parents=True, exist_ok=True)
    fd = os.open(data / "ppf.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise CommandError(
            f"another ppf (pid {holder}) is running on the data directory {data}: "
            "stop it first, or give this one a --data directory of its own"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def port_holder(port: int) -> str:
    """Who listens on TCP ``port`` on this machine, as ``pid N (name)``, from ``/proc``
    (Linux; "" where it cannot be told: another OS, another user's process)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return ""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    name = (proc / "comm").read_text().strip()
                    return f"pid {proc.name} ({name})"
        except OSError:
            continue
    return ""


def port_taken(host: str, port: int, flag: str) -> CommandError:
    """The one line a command says when ``host:port`` is another program's."""
    holder = port_holder(port)
    by = f" by {holder}" if holder else " by another program"
    return CommandError(f"{host}:{port} is in use{by}: stop it, or give {flag} another HOST:PORT")


# A stop step still running after this long is said while it runs (``stop_waiting``), and
# again when it ends (``stop_slow``), naming it: a stop that stalls for good tells where.
SLOW_STOP_S = 2.0


def stop_step(
    stack: AsyncExitStack, name: str, stop: Callable[..., Awaitable[Any]], *args: Any
) -> None:
    """``stop(*args)`` pushed onto ``stack`` (run in reverse, as every stop is), timed."""
    import structlog

    log = structlog.get_logger("ppf")

    async def timed() -> None:
        began = time.monotonic()
        waiting = asyncio.get_running_loop().call_later(
            SLOW_STOP_S, lambda: log.warning("stop_waiting", part=name, after_s=SLOW_STOP_S)
        )
        try:
            await stop(*args)
        finally:
            waiting.cancel()
            if (took := time.monotonic() - began) > SLOW_STOP_S:
                log.warning("stop_slow", part=name, after_s=round(took, 1))

    stack.push_async_callback(timed)


# Once a command's work is done, its process has this long to exit. Past it, what holds
# the exit (a thread of the loop's executor, a non-daemon thread) is said with its stack,
# and the process ends with the command's code: a fresh-clone run met ppf up still alive
# 30 s after every part of it had stopped.
EXIT_GRACE_S = 5.0


async def watched_exit(work: Awaitable[Any]) -> Any:
    """``work``, then a watch on the process's exit (see ``EXIT_GRACE_S``)."""
    code = 1
    try:
        result = await work
        code = int(result or 0)
        return result
    finally:
        threading.Thread(target=_exit_by, args=(code,), daemon=True, name="exit-watch").start()


def _exit_by(code: int) -> None:
    time.sleep(EXIT_GRACE_S)
    import structlog

    frames = sys._current_frames()
    holding = {
        t.name: traceback.format_stack(frames[t.ident])[-3:]
        for t in threading.enumerate()
        if t.ident in frames and t is not threading.current_thread()
    }
    structlog.get_logger("ppf").warning("exit_stalled", after_s=EXIT_GRACE_S, threads=holding)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
