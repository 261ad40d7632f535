"""The PPF stream read through nats-py's ordered consumer: where the lean reader
(``eventlog/stream.py``) does not go, a NATS reached over TLS. nats-py does the TLS, the
reconnects to another of the cluster's URLs and the ordered consumer's gap handling;
this module only turns its messages into the fold's ``(stream_seq, server_ts_ms,
subject, payload)`` batches, read from the same ack reply subject the lean reader reads,
so the two hand the fold the same messages (tests/test_nats_tls.py checks it).

Slower: nats-py parses each message into a ``Msg`` (docs/decisions.md, The log).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from eventlog.protocol import Message
from events import STREAM
from events.subjects import STREAM_SUBJECTS

__all__ = ["ordered_batches"]

_BATCH = 2_500  # messages a batch at most: the lean reader's batches are about as big


def _message(msg: Msg) -> Message:
    tok = msg.reply.split(".")
    if len(tok) == 9:
        sseq, ts_ns = int(tok[5]), int(tok[7])
    else:  # v2 reply with domain and account hash
        sseq, ts_ns = int(tok[7]), int(tok[9])
    return (sseq, ts_ns // 1_000_000, msg.subject.encode(), msg.data)


async def ordered_batches(
    js: JetStreamContext, start_seq: int, until: int | None = None
) -> AsyncIterator[list[Message]]:
    """Batches in stream order from ``start_seq``, forever or to ``until``."""
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def arrived(msg: Msg) -> None:
        queue.put_nowait(msg)

    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=max(start_seq, 1),
        ack_policy=AckPolicy.NONE,
    )
    sub = await js.subscribe(
        STREAM_SUBJECTS,
        stream=STREAM,
        cb=arrived,
        config=config,
        ordered_consumer=True,
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    try:
        while True:
            batch = [_message(await queue.get())]
            while len(batch) < _BATCH and not queue.empty():
                batch.append(_message(queue.get_nowait()))
            if until is not None and batch[-1][0] >= until:
                yield [m for m in batch if m[0] <= until]
                return
            yield batch
    finally:
        await sub.unsubscribe()
