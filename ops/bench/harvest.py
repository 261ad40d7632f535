"""``ppf bench harvest``: a cold ``ppf up`` against the world in a box.

One source page lists ``candidates`` addresses of which ``working_share`` work (real
proxies behind relays with 100-400 ms round trips); the dead are split between the
three kinds (refusing, silent, accepting and never answering), plus a portal and a
garbage speaker. ``ppf up`` runs with its defaults (no lab mode; its own judge given
to the world with ``--public-url``, the box's public judges and HTTPS endpoint named),
its local worker and checker as shipped. Measured from the moment ``ppf up`` starts:

- seconds until ``GET /v1/proxies`` serves the first 100 working proxies;
- candidates settled per second: every candidate checked (worked or failed), over the
  time from the source being added to the worker's cycle being done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.bench.options import Harvest
from ops.bench.upbox import Refused, UpBeside, gateway_json, up_beside
from ops.lab.world import World

__all__ = ["bench_harvest"]


async def _served(base: str) -> int:
    with contextlib.suppress(Refused):
        return len(
            (await gateway_json(base, lambda api: api.proxies(limit=0, mitm="any")))["proxies"]
        )
    return 0


async def bench_harvest(harvest: Harvest) -> dict[str, Any]:
    candidates, working_share = harvest.candidates, harvest.working_share
    working = max(int(candidates * working_share), 7)
    dead_each = (candidates - working - 2) // 3  # the portal and the garbage speaker
    with tempfile.TemporaryDirectory(prefix="ppf-bench-harvest-") as tmp:
        root = Path(tmp)
        with World(root / "world", dead_each=dead_each, extra_working=working - 7) as world:
            started = time.monotonic()
            with up_beside(world, root) as up:
                return await _measure(up, world, started, candidates)


async def _measure(up: UpBeside, world: World, started: float, candidates: int) -> dict[str, Any]:
    await up.started()
    await up.add_source(world.page_url)
    added = time.monotonic()
    first_100 = None
    deadline = added + 600
    while time.monotonic() < deadline:
        served = await _served(up.base)
        if first_100 is None and served >= 100:
            first_100 = time.monotonic() - started
        cycle = _cycle_done(up.log)
        if cycle is not None and first_100 is not None:
            break
        await asyncio.sleep(0.5)
    cycle = _cycle_done(up.log)
    if cycle is None:
        raise RuntimeError(f"the worker did not finish its cycle:\n{up.log.read_text()[-2000:]}")
    checked, ended = cycle
    settle_s = ended - added
    served = await _served(up.base)
    return {
        "candidates_listed": candidates,
        "working_in_the_box": len(world.proxies) + len(world.extra),
        "dead_each_kind": len(world.refusing),
        "checked": checked,
        "served_at_the_end": served,
        "first_100_served_s_from_cold_start": round(first_100, 1) if first_100 else None,
        "settle_s": round(settle_s, 1),
        "candidates_settled_per_s": round(checked / settle_s, 1),
        "defaults": {"check_concurrency": 500, "check_timeout_s": 5.0, "max_proxies": 20_000},
    }


def _cycle_done(log: Path) -> tuple[int, float] | None:
    """(checked, when) of the local worker's first finished cycle, from its log line (the
    time mapped to this process's monotonic clock)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"cycle_done"' in line:
            row = json.loads(line)
            if row.get("agent") == "local-worker" and row.get("checked"):
                return int(row["checked"]), time.monotonic() - (time.time() - _ts(row))
    return None


def _ts(row: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(row["timestamp"]).replace("Z", "+00:00")).timestamp()
