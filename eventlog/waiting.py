"""Asking a log that may not answer yet: a cluster still forming at start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
import structlog

from eventlog.protocol import LogError

__all__ = ["START_PAUSE_MAX_S", "START_WAIT_S", "TRANSIENT", "until_answered"]

log = structlog.get_logger("ppf.log")

T = TypeVar("T")

# What a publish or a read meets while a cluster loses a node or elects a stream leader:
# retried, then a LogError (the gateway's 503), never an error of nats-py's own.
TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)

# How long a process starting against a log that does not answer yet (a cluster still
# forming: nodes started one after another, a stream's replicas electing a leader) asks
# again, with backoff and a log line each time, before it gives up with the reason.
START_WAIT_S = 300.0
START_PAUSE_MAX_S = 5.0


async def until_answered(
    what: str,
    ask: Callable[[], Awaitable[T]],
    *,
    wait_s: float = START_WAIT_S,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """``ask()``'s answer, asked again while it fails with a ``transient`` error, each
    wait logged (``start_waiting``) and twice the one before (0.1 s up to
    ``START_PAUSE_MAX_S``); past ``wait_s``, a LogError that names ``what`` and why."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = 0.1
    while True:
        try:
            return await ask()
        except transient as exc:
            if loop.time() + pause > deadline:
                if isinstance(exc, LogError) and not wait_s:
                    raise  # asked once: in its own words
                why = str(exc) if isinstance(exc, LogError) else repr(exc)  # ours say it
                raise LogError(f"{what}: no answer in {wait_s:.0f} s: {why}") from exc
            log.info("start_waiting", what=what, error=repr(exc), again_in_s=pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, START_PAUSE_MAX_S)
