"""The loop every agent runs: a cycle, or an idle wait when there was no work."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

__all__ = ["run_cycles"]

log = structlog.get_logger("ppf.agent")


async def run_cycles(
    name: str,
    cycle: Callable[[], Awaitable[int]],
    stop: asyncio.Event,
    *,
    idle_s: float,
    cycles: int | None = None,
) -> int:
    """Run ``cycle`` until ``stop`` (or ``cycles`` cycles with work); returns cycles done.

    A cycle returns how many leases it worked; a failed cycle is logged and waited out
    like an idle one, never the end of the agent.
    """
    done = 0
    while not stop.is_set():
        try:
            did = await cycle()
        except Exception as exc:
            log.warning("cycle_failed", agent=name, error=repr(exc))
            did = 0
        if did:
            done += 1
            if cycles is not None and done >= cycles:
                break
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), idle_s)
    return done
