"""``ppf bench quality``: do the quality signals say what the churn lab did?

The churn lab (``ops/lab/churn.py``, profile ``steady``) in the world in a box, each
relay shaped to its own rate (``plan(shaped=True)``: 40 to 1,600 kB/s, a seeded order),
``ppf up`` beside it on the lab's clock with every routine recheck ``interval_s``
simulated seconds apart, the page listing every proxy added. At the end of
``duration`` simulated seconds, ``GET /v1/proxies?status=all`` against the lab's truth:

- uptime: for each proxy whose uptime is of at least ``MIN_CHECKS`` checks, its
  ``uptime_pct`` against the share of the time from its ``first_seen`` to the end the
  lab had it up; the median absolute error, in points;
- speed: the ``speed_kb_s`` the checker measured through each proxy against its
  relay's rate; Spearman's rank correlation (ranks of ties averaged).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ops.bench.options import Quality
from ops.bench.pool import churn_beside
from ops.bench.upbox import gateway_json
from ops.lab.churn import Plan, plan

__all__ = ["MIN_CHECKS", "bench_quality", "spearman", "uptime_truth"]

MIN_CHECKS = 10


async def bench_quality(quality: Quality, seed: int = 1, interval_s: int = 30) -> dict[str, Any]:
    proxies, speed, duration = quality.proxies, quality.speed, quality.duration
    schedule = plan("steady", proxies, seed, duration, shaped=True)
    async with churn_beside(schedule, speed, interval_s=interval_s) as (world, up):
        end = world.churn_t0 + duration / speed
        await asyncio.sleep(max(0.0, end - time.time()))
        everything = {"limit": 0, "status": "all", "mitm": "any"}
        body = await gateway_json(up.base, lambda api: api.proxies(**everything))
        at = time.time()
        index = {addr: i for i, addr in enumerate(world.churn_addresses())}
        t0 = world.churn_t0
    rows = {index[p["ip"], p["port"]]: p for p in body["proxies"] if (p["ip"], p["port"]) in index}
    errors, pairs = [], []
    for i, p in sorted(rows.items()):
        if (p.get("uptime_checks") or 0) >= MIN_CHECKS and p.get("uptime_pct") is not None:
            began = (p["first_seen"] / 1000 - t0) * speed
            truth = uptime_truth(schedule, i, began, (at - t0) * speed)
            errors.append(abs(p["uptime_pct"] - 100 * truth))
        if p.get("speed_kb_s"):
            pairs.append((schedule.rate_kb_s[i], p["speed_kb_s"]))
    return {
        "proxies": proxies,
        "speed": speed,
        "simulated_s": duration,
        "recheck_interval_s": interval_s,
        "served_rows": len(rows),
        "uptime_proxies": len(errors),
        "uptime_median_abs_error_pts": round(statistics.median(errors), 1) if errors else None,
        "uptime_abs_error_p90_pts": (
            round(sorted(errors)[int(0.9 * (len(errors) - 1))], 1) if errors else None
        ),
        "speed_proxies": len(pairs),
        "speed_spearman": round(spearman(pairs), 3) if len(pairs) > 2 else None,
        "speed_pairs_kb_s": sorted(pairs),
    }


def uptime_truth(schedule: Plan, i: int, start_s: float, end_s: float) -> float:
    """The share of simulated seconds [start_s, end_s) proxy ``i`` was up by the plan."""
    start, end = int(start_s * 1000), int(end_s * 1000)
    if end <= start:
        return 1.0
    down = sum(max(0, min(d.end_ms, end) - max(d.start_ms, start)) for d in schedule.downs[i])
    return 1 - down / (end - start)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and values[order[j + 1]] == values[order[k]]:
            j += 1
        for m in range(k, j + 1):
            ranks[order[m]] = (k + j) / 2  # ties share their average rank
        k = j + 1
    return ranks


def spearman(pairs: Sequence[tuple[float, float]]) -> float:
    """Spearman's rank correlation of the pairs (Pearson's of their ranks)."""
    xs, ys = _ranks([a for a, _ in pairs]), _ranks([b for _, b in pairs])
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    var = (sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)) ** 0.5
    return cov / var if var else 0.0
