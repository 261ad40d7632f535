"""What the benches stand up, written once: NATS servers of their own, each in its own
store under the bench's directory on a free port, stopped however the bench ends; and
the pinned workload published from a child process (ops/bench/streams.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

from eventlog.client import Log
from ops.bench.streams import Workload, publisher
from ops.nats.server import NatsServer, ServerTls, free_port

__all__ = [
    "Workload",
    "checkout",
    "ensure_stream",
    "head_seq",
    "nats_servers",
    "publish_workload",
]


def checkout(tree: Path) -> Path:
    """Another commit's checkout (``git worktree add DIR REV``), resolved; refused with a
    clear error when it is not one."""
    if not (tree / "projections" / "replay.py").exists():
        raise SystemExit(f"{tree} is not a ppf checkout (no projections/replay.py)")
    return tree.resolve()


@contextlib.contextmanager
def nats_servers(
    root: Path, *names: str, tls: ServerTls | None = None
) -> Iterator[list[NatsServer]]:
    """A started server for each name, its store ``root/name``."""
    servers = [NatsServer(root / name, port=free_port(), tls=tls) for name in names]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


async def publish_workload(work: Workload) -> None:
    """The pinned workload into its servers (ops/bench/streams.py ``Workload``), by its
    own process: its memory and CPU are not the bench's."""
    child = await asyncio.create_subprocess_exec(
        *publisher(work), stdout=asyncio.subprocess.DEVNULL
    )
    if await child.wait() != 0:
        raise RuntimeError("publishing the workload failed")


async def head_seq(url: str) -> int:
    """The stream's last sequence number."""
    lg = await Log.connect(url)
    try:
        return await lg.head_seq()
    finally:
        await lg.close()


async def ensure_stream(url: str) -> None:
    """The stream made, as ``ppf up`` makes it, before anything reads or writes it."""
    lg = await Log.connect(url)
    try:
        await lg.ensure_stream()
    finally:
        await lg.close()
