"""The seed read model: how the bulk imports stand (``ppf seed status``, ``/v1/stats``).

Pure: built from the ledger's seed ranges and the deposits projection at ``now``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reducers.pool import lease_live
from reducers.state import State

__all__ = ["seed_candidates", "seed_status"]


def seed_status(state: State, now: int) -> dict[str, Any]:
    plans: dict[str, dict[str, Any]] = {}
    failed: list[dict[str, Any]] = []
    for row in state.leases.values():
        if row.kind != "seed":
            continue
        plan = row.target.partition("-")[0]
        p = plans.setdefault(
            plan,
            {
                "input": row.input,
                "kind": row.input_kind,
                "priority": row.priority,
                "items": 0,
                "reached": 0,
                "ranges": {"waiting": 0, "working": 0, "done": 0, "failed": 0},
            },
        )
        p["items"] += row.end - row.start + 1
        p["reached"] += min(row.cursor, row.end + 1) - row.start
        if row.cursor > row.end:
            status = "done"
        elif row.status == "failed":
            status = "failed"
            failed.append({"range": row.target, "attempts": row.attempts, "error": row.last_error})
        elif lease_live(row, now):
            status = "working"
        else:
            status = "waiting"
        p["ranges"][status] += 1
    deposits = {"pending": 0, "folded": 0, "poisoned": 0}
    nodes: dict[str, dict[str, int]] = {}
    poisoned = []
    for d in state.deposits.values():
        deposits[d.status] = deposits.get(d.status, 0) + 1
        if d.target:
            n = nodes.setdefault(d.agent, {"batches": 0, "items": 0, "last_at": 0})
            n["batches"] += 1
            n["items"] += d.next - d.start
            n["last_at"] = max(n["last_at"], d.at)
        if d.status == "poisoned":
            poisoned.append({"key": d.key, "agent": d.agent, "reason": d.reason})
    return {
        "plans": dict(sorted(plans.items())),
        "deposits": deposits,
        "nodes": dict(sorted(nodes.items())),
        "failed_ranges": sorted(failed, key=lambda f: f["range"]),
        "poisoned": sorted(poisoned, key=lambda p: p["key"])[:100],
    }


def _range_order(target: str) -> tuple[str, int]:
    """``p1a2b-r500`` -> (``p1a2b``, 500): a plan's ranges in the order of their items."""
    plan, _, rng = target.partition("-")
    digits = rng.lstrip("r")
    return plan, int(digits) if digits.isdigit() else 0


def seed_candidates(state: State, claiming: set[str], now: int) -> Iterator[tuple[str, float]]:
    """Free seed ranges (none of ``claiming``, the claims in flight), priorities taking
    turns: while a lower priority has ranges waiting, a higher one holds at most half of
    the ranges in flight (its share and everything below it), so a big urgent plan never
    starves the rest. Ranges of one priority go in order, so a plan is worked from its
    start. Each with its priority, as a grant's score."""
    waiting: dict[int, list[str]] = {}
    flying: dict[int, int] = {}
    for row in state.leases.values():
        if row.kind != "seed" or row.cursor > row.end or row.status == "failed":
            continue
        if lease_live(row, now) or row.target in claiming:
            flying[row.priority] = flying.get(row.priority, 0) + 1
        else:
            waiting.setdefault(row.priority, []).append(row.target)
    for queue in waiting.values():
        queue.sort(key=_range_order)
        queue.reverse()  # popped from the end
    while waiting:
        levels = sorted(waiting, reverse=True)
        for i, level in enumerate(levels):
            below = sum(n for p, n in flying.items() if p < level)
            if i == len(levels) - 1 or flying.get(level, 0) + 1 <= below:
                break
        queue = waiting[level]
        target = queue.pop()
        if not queue:
            del waiting[level]
        flying[level] = flying.get(level, 0) + 1
        yield target, float(level)
