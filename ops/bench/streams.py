"""Publishing a benchmark's events to one or more servers' streams, kept in step: the
synthetic stream (``ops/bench/synthetic.py``) and the workload's steps
(``ops/bench/workload.py``), each from a child process (``publish_synthetic``,
``synthetic_in_lockstep``, ``publisher``).

Core NATS publishes (no ack awaited per message), each under the subject and
``Nats-Msg-Id`` the fleet uses (``ops.bench.synthetic.route``); ``keep_up`` holds the
publisher back while a server's ingest falls behind, and ``close`` waits until every
stream holds what was sent.
"""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec

from eventlog.client import Log
from events import Event, Located, encode
from ops.bench import synthetic
from ops.bench.synthetic import route
from ops.bench.workload import steps
from ops.progress import Progress

__all__ = ["Streams", "Workload", "publish_synthetic", "publisher", "synthetic_in_lockstep"]


class Streams:
    def __init__(self, logs: list[Log], starts: list[int]) -> None:
        self.logs = logs
        self.starts = starts
        self.sent = [0] * len(logs)

    @classmethod
    async def open(cls, urls: list[str]) -> Streams:
        logs = [await Log.connect(url, name="ppf-bench-publisher") for url in urls]
        starts = []
        for lg in logs:
            await lg.ensure_stream()
            starts.append(await lg.head_seq())
        return cls(logs, starts)

    async def send(self, i: int, event: Event) -> None:
        subject, msg_id = route(event)
        await self.logs[i].nc.publish(subject, encode(event), headers={"Nats-Msg-Id": msg_id})
        self.sent[i] += 1

    async def keep_up(self, slack: int) -> None:
        """Wait until every stream is within ``slack`` messages of what was sent: the
        servers' ingest queues stay short."""
        for lg, start, count in zip(self.logs, self.starts, self.sent, strict=True):
            await lg.nc.flush()
            while await lg.head_seq() < start + count - slack:
                await asyncio.sleep(0.01)

    async def close(self, *, others: bool = False) -> list[int]:
        """Wait until each stream holds what was sent; its head. ``others``: someone
        else publishes there too (a gateway's Located), so it may hold more."""
        heads = []
        for lg, start, count in zip(self.logs, self.starts, self.sent, strict=True):
            await lg.nc.flush()
            deadline = time.monotonic() + 60
            while (head := await lg.head_seq()) < start + count and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await lg.close()
            if head < start + count or (head != start + count and not others):
                raise RuntimeError(f"a stream holds {head - start} of {count} published messages")
            heads.append(head)
        return heads


async def publish_synthetic(url: str, n: int, proxies: int, seed: int) -> int:
    """The synthetic stream published to ``url`` from a child process; the head."""
    return (await synthetic_in_lockstep([url], n, proxies, seed))[0]


async def synthetic_in_lockstep(
    urls: list[str], n: int, proxies: int, seed: int, located_in: int | None = None
) -> list[int]:
    """``_synthetic`` in a child process (its memory and CPU are not the fold's); the
    streams' heads."""
    command = [sys.executable, "-m", "ops.bench.streams", "synthetic", ",".join(urls)]
    command += [str(n), str(proxies), str(seed)]
    command += [] if located_in is None else [f"located={located_in}"]
    child = await asyncio.create_subprocess_exec(*command)
    if await child.wait() != 0:
        raise RuntimeError("publishing the synthetic events failed")
    heads = []
    for url in urls:
        lg = await Log.connect(url)
        heads.append(await lg.head_seq())
        await lg.close()
    return heads


async def _synthetic(
    urls: list[str], n: int, proxies: int, seed: int, located_in: int | None = None
) -> list[int]:
    """Publish the synthetic stream to every server of ``urls`` in lockstep (each event
    to all of them in turn, the ``Located`` only to ``urls[located_in]``); returns their
    stream heads.

    Why in lockstep: a message's time is the server's clock when it stores it, and the
    reducers act on it (30 s buckets of the pool's composition, quota windows). Streams
    published one after the other, at whatever pace the publisher keeps, get timelines
    of their own: one crosses a bucket's edge mid-stream where the other does not, and
    the fold of every other event differs with it.
    Published together, the same event has the same time in each, within tens of ms.
    """
    streams = await Streams.open(urls)
    progress = Progress("publish", n)
    events = synthetic.events(n, proxies=proxies, seed=seed, located=located_in is not None)
    for made, ev in enumerate(events, 1):
        only = located_in if isinstance(ev, Located) else None
        for i in range(len(urls)):
            if only is None or i == only:
                await streams.send(i, ev)
        if made % 20_000 == 0:
            await streams.keep_up(40_000)
            progress.update(min(made, n))
    heads = await streams.close()
    progress.close()
    return heads


class Workload(msgspec.Struct):
    """The pinned workload's steps (ops/bench/workload.py) for each server of ``urls``,
    each in its form (``forms``: ``s`` single events, ``r`` rounds, one letter a server);
    without ``setup``, the first step (enrolments, settings, sources) is left out;
    ``first``: new proxies from the ``first``-th on."""

    urls: list[str]
    forms: str
    observations: int
    proxies: int
    seed: int
    setup: bool = True
    first: int = 0


async def _workload(work: Workload) -> int:
    """Publish the workload to its servers in lockstep; the observations made."""
    streams = await Streams.open(work.urls)
    made = 0
    progress = Progress("publish", work.observations)
    made_steps = steps(work.observations, proxies=work.proxies, seed=work.seed, first=work.first)
    for n, step in enumerate(made_steps):
        if n == 0 and not work.setup:
            continue
        for i, form in enumerate(work.forms):
            for event in step.singles if form == "s" else step.rounds:
                await streams.send(i, event)
        made += step.observations
        if n % 50 == 49:
            await streams.keep_up(20_000)
            progress.update(made)
    await streams.close(others=True)  # a gateway may publish there too (its Located)
    progress.close()
    return made


def publisher(work: Workload) -> list[str]:
    """The command that publishes ``work`` from a child process (its memory and CPU are
    not the bench's)."""
    return [
        sys.executable,
        "-m",
        "ops.bench.streams",
        "workload",
        msgspec.json.encode(work).decode(),
    ]


if __name__ == "__main__":
    from ops.telemetry import logs

    logs.configure()
    what, urls, *args = sys.argv[1:]
    if what == "synthetic":  # URLS N PROXIES SEED [located=I]
        n, px, sd, *located = args
        at = int(located[0].removeprefix("located=")) if located else None
        asyncio.run(_synthetic(urls.split(","), int(n), int(px), int(sd), at))
    else:  # workload JSON (``publisher``)
        asyncio.run(_workload(msgspec.json.decode(urls, type=Workload)))
