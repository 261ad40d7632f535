"""Ending background tasks for certain.

On Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives in the same turn
of the loop as the result it waits for (CPython gh-86296, fixed in 3.12), and nats-py
awaits every request through it. A loop whose step is a NATS request can so take a
``cancel()`` and carry on: in CI the dashboard sampler went on sampling after the
gateway's cleanup had cancelled it, and the cleanup waited for it until the test timed
out. Stopping therefore cancels again until the tasks are done, within a bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["stop_tasks"]


async def stop_tasks(tasks: Iterable[asyncio.Task[object]], timeout_s: float = 10.0) -> int:
    """Cancel ``tasks`` until each has ended; returns how many still run after
    ``timeout_s`` (a task stuck in a call that ignores cancellation must not hold a
    shutdown forever). Their exceptions are retrieved, not raised: they are stopping."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        done, pending = await asyncio.wait(pending, timeout=min(0.2, left))
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" noise at exit
    return len(pending)
