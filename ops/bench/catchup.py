"""What a fresh gateway delivers catching up with a log (``ppf bench fold``'s headline):
wall clock from its fold's start to the served pool view holding the stream's last
message, as ``ppf gateway`` runs them (the fold in memory, its checkpoint writer
keeping the digest, the view following the fold), in this process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gateway.views import FOLLOW_S, PoolViewKeeper
from ops.nats.client import Log
from projections.live import FoldService

__all__ = ["gateway_catch_up"]


async def gateway_catch_up(url: str, head: int, timeout_s: float = 900.0) -> dict[str, Any]:
    """Seconds to the fold's last message and to the view holding it, and the CPU
    seconds of this process meanwhile (the checkpoint writer's child not counted)."""
    lg = await Log.connect(url, name="ppf-bench-gateway")
    fold = FoldService(lg, dlq=False)
    keeper = PoolViewKeeper(foreground=fold.foreground, catching_up=fold.catching_up)
    cpu, started = time.process_time(), time.perf_counter()
    await fold.start()
    follower = asyncio.create_task(keeper.follow(lambda: fold.state))
    folded_s = 0.0
    try:
        while (view := keeper.current) is None or view.seq < head:
            if not folded_s and fold.state.last_seq >= head:
                folded_s = time.perf_counter() - started
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the gateway did not catch up with {head} in {timeout_s} s")
            await asyncio.sleep(FOLLOW_S / 5)
        served_s = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await fold.stop()
        await lg.close()
    return {
        "seconds": round(served_s, 2),
        "fold_seconds": round(folded_s or served_s, 2),
        "view_after_fold_s": round(served_s - (folded_s or served_s), 2),
        "cpu_seconds": round(cpu, 2),
    }
