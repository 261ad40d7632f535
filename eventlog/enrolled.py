"""Whether an agent's name holds a token now, read from the log: its latest enrolment
(``ppf token`` refuses to replace a token unasked, or to revoke one that is not)."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from eventlog.client import Log
from events import AgentEnrolled, decode
from events.subjects import enrolment_subject

__all__ = ["holds_token"]


async def holds_token(lg: Log, name: str) -> bool:
    """Whether ``name``'s latest enrolment gave it a token (a revocation gives none):
    read from its subject, its heartbeats there too, as far as the stream holds it."""
    subject = enrolment_subject(name)
    count = await lg.subject_msgs(subject)
    if not count:
        return False
    latest, seen, done = "", 0, asyncio.Event()

    async def got(msg: Msg) -> None:
        nonlocal latest, seen
        seen += 1
        if isinstance(event := decode(msg.data), AgentEnrolled):
            latest = event.token_sha256
        if seen >= count:
            done.set()

    sub = await lg.js.subscribe(
        subject, cb=got, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        async with asyncio.timeout(60):
            await done.wait()
    finally:
        await sub.unsubscribe()
    return bool(latest)
