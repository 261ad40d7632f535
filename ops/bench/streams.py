"""Publishing a benchmark's events to one or more servers' streams, kept in step.

Core NATS publishes (no ack awaited per message), each under the subject and
``Nats-Msg-Id`` the fleet uses (``ops.bench.synthetic.route``); ``keep_up`` holds the
publisher back while a server's ingest falls behind, and ``close`` waits until every
stream holds what was sent.
"""

from __future__ import annotations

import asyncio
import time

from events import Event, encode
from ops.bench.synthetic import route
from ops.nats.client import Log

__all__ = ["Streams"]


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
