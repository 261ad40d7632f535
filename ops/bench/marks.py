"""``ppf bench marks``: what the re-send window (reducers/marks.py) holds in memory.

Each of ``agents`` agents sends more ids than its window keeps, in random order within
each millisecond, so every window is full; tracemalloc counts what the marks hold.
"""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

from events.ids import uuid7
from ops.bench.options import Marks
from reducers.marks import Mark, see

__all__ = ["bench_marks"]


def bench_marks(options: Marks, seed: int = 1) -> dict[str, Any]:
    agents, window = options.agents, options.window
    rng = random.Random(seed)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        marks: dict[str, Mark] = {}
        for a in range(agents):
            name = f"agent-{a:04d}"
            for i in range(window + window // 4):
                eid = uuid7(1_800_000_000_000 + i, rng.getrandbits(80).to_bytes(10, "big"))
                see(marks, name, eid, window)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return {
        "agents": agents,
        "window": window,
        "ids_kept": sum(len(m.ids) for m in marks.values()),
        "marks_mb": round(held / 1e6, 1),
        "per_agent_kib": round(held / agents / 1024, 1),
    }
