"""``ppf bench pool``: is what ``/v1/proxies`` serves as alive working when it is served?

The churn lab (``ops/lab/churn.py``) stands in the world in a box: ``--proxies`` real
proxies dying and coming back on the profile's seeded schedule, ``--speed`` times fast.
``ppf up`` runs beside it with its defaults (no lab mode), its TTLs and intervals put on
the lab's clock through ``Configured`` (``churn.scaled``), and the source page listing
every proxy added. A **consumer** then does what a user does: every few seconds it takes
the whole pool (``GET /v1/proxies?limit=0``) and tries everything it was served through
a public judge of the box; it never reports back (reports are tested apart: a measure
that fed itself could only flatter). Figures, in simulated time where they are times:

- served precision: of the proxies served, the share that worked when tried;
- recall: of the proxies up (the lab's truth), the share the pool served;
- detection latency: from a death to the proxy gone from ``alive``, median and p90;
- revival latency: from a return to the proxy served again, median and p90;
- check cost: the checker's checks per proxy per simulated hour.

The first tenth of the run is left out of the figures (the pool fills then).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents.check import Judge, check
from eventlog.client import Log
from gatewayapi import GatewayApi
from ops.bench.options import Pool
from ops.bench.upbox import UpBeside, gateway_json, up_beside
from ops.lab.churn import PROFILES, Plan, plan, scaled
from ops.lab.world import World

__all__ = ["bench_pool", "churn_beside"]


async def bench_pool(pool: Pool, poll_s: float = 3.0) -> dict[str, Any]:
    """``pool.interval`` (simulated, 0: ppf's defaults): every routine recheck interval
    set to it, a failing proxy's to ``pool.failing`` (0: half of it), a dead one's at most
    ten times the longer of the two. (Where only precision counts, as in ``flappy``'s
    bar, a failing proxy is worth fewer checks than a live one: its checks buy recall.)"""
    schedule = plan(pool.profile, pool.proxies, pool.seed, pool.duration)
    lab = churn_beside(schedule, pool.speed, pool.budget, pool.interval, pool.failing)
    async with lab as (world, up):
        consumer = Consumer(up.base, world, await Judge.discover(world.judges["httpbin"]))
        figures = await consumer.run(poll_s)
    checks = figures.pop("checks")
    return {
        "profile": pool.profile,
        "proxies": pool.proxies,
        "seed": pool.seed,
        "speed": pool.speed,
        "simulated_s": pool.duration,
        "recheck_budget_per_hour": pool.budget,
        "recheck_interval_s": pool.interval or "defaults",
        "recheck_failing_s": pool.failing or "defaults",
        **figures,
        # The checkers' rechecks; the local worker's fetches of the page check every
        # listed proxy again on top (its source interval, scaled too).
        "checks_per_proxy_per_sim_hour": round(checks / pool.proxies / (pool.duration / 3_600), 1),
    }


@contextlib.asynccontextmanager
async def churn_beside(
    schedule: Plan, speed: float, budget: int = 0, interval_s: int = 0, failing_s: int = 0
) -> AsyncIterator[tuple[World, UpBeside]]:
    """The churn lab playing ``schedule`` in the world in a box, ``speed`` times fast,
    and ``ppf up`` beside it on the lab's clock (``_start``: every routine recheck
    ``interval_s`` simulated seconds apart, 0: ppf's defaults; a failing proxy's
    ``failing_s``, 0: half of it; ``budget`` rechecks an hour, 0: no cap), the page
    listing every proxy added."""
    if interval_s and not failing_s:
        failing_s = max(1, interval_s // 2)
    # The agents' own waits on the lab's clock too (30 s of the checker's is five
    # simulated minutes at speed 10), and no longer than a tenth of the shortest recheck
    # interval asked, as ppf's own 30 s are of its 300 s (a checker with nothing due
    # asks again after its idle wait).
    shortest = min(interval_s, failing_s) if interval_s else 300
    idle = ("--agents-idle", str(round(min(30, shortest / 10) / speed, 2)))
    with tempfile.TemporaryDirectory(prefix="ppf-bench-churn-") as tmp:
        root = Path(tmp)
        with (
            World(root / "world", churn=schedule, speed=speed, dead_each=1) as world,
            up_beside(world, root, *idle) as up,
        ):
            await _start(up, world, speed, budget, interval_s, failing_s)
            yield world, up


async def _start(
    up: UpBeside, world: World, speed: float, budget: int, interval_s: int, failing_s: int
) -> None:
    from ops.cli.admin import reconfigure

    await up.started()
    lg = await Log.connect(up.nats_url, name="ppf-bench-pool")
    try:
        # ppf on the lab's clock, `ppf up`'s own settings kept (trust, its agents).
        def change(s: Any) -> Any:
            import msgspec

            if interval_s:
                s = msgspec.structs.replace(
                    s,
                    recheck_failing_s=failing_s,
                    recheck_fresh_s=interval_s,
                    recheck_settled_s=interval_s,
                    recheck_veteran_s=interval_s,
                    recheck_dead_s=10 * max(interval_s, failing_s),
                )
            s = scaled(s, speed)
            per_hour = round(budget * speed) if budget else 0
            return msgspec.structs.replace(s, recheck_budget_per_hour=per_hour)

        if await reconfigure(lg, change) is None:
            raise RuntimeError("could not configure ppf for the lab's clock")
    finally:
        await lg.close()
    await up.add_source(world.churn_page_url)


class Consumer:
    """A user of the pool: takes it all, tries all of it, keeps score against the lab."""

    def __init__(self, base: str, world: World, judge: Judge, concurrency: int = 200) -> None:
        self.base, self.world, self.judge = base, world, judge
        self.index = {addr: i for i, addr in enumerate(world.churn_addresses())}
        self.gate = asyncio.Semaphore(concurrency)
        self.tried = self.worked = self.failed_while_up = 0
        self.recall: list[float] = []
        # per proxy: (wall time of the poll, served?) for the latencies
        self.seen: list[list[tuple[float, bool]]] = [[] for _ in self.index]
        self.polls: list[tuple[float, int, int]] = []  # (wall time, tried, worked) a poll

    async def _try(self, ip: str, port: int, proto: str) -> bool:
        async with self.gate:
            start = time.time()
            # As served: a user takes the protocol the pool names (guessing it, as a
            # check of an unknown address does, tried up to four in turn and made each
            # try last several round trips longer than a user's).
            result = await check(ip, port, proto or None, self.judge, timeout=5.0)
            i = self.index[(ip, port)]
            if not result.ok and self.world.churn_up(i, start) and self.world.churn_up(i):
                # Up by the lab's truth all along: a loss the pool's liveness cannot see
                # (the consumer's own check, a slow proxy), told apart from a dead one.
                self.failed_while_up += 1
            return result.ok

    async def run(self, poll_s: float) -> dict[str, Any]:
        world = self.world
        assert world.churn is not None
        end = world.churn_t0 + world.churn.duration_ms / 1000 / world.speed
        warm = world.churn_t0 + (end - world.churn_t0) / 10
        while (now := time.time()) < end:
            body = await gateway_json(self.base, lambda api: api.proxies(limit=0))
            protos = {(p["ip"], p["port"]): p["proto"] for p in body["proxies"]}
            served = set(protos) & set(self.index)
            for addr, i in self.index.items():
                self.seen[i].append((now, addr in served))
            if now >= warm:
                up = {addr for addr, i in self.index.items() if world.churn_up(i, now)}
                if up:
                    self.recall.append(len(served & up) / len(up))
                results = await asyncio.gather(
                    *(self._try(ip, port, protos[ip, port]) for ip, port in served)
                )
                self.tried += len(results)
                self.worked += sum(results)
                self.polls.append((now, len(results), sum(results)))
            await asyncio.sleep(max(0.0, poll_s - (time.time() - now)))
        stats = await gateway_json(self.base, GatewayApi.agents)
        return self._figures(warm, stats)

    def _latencies(self, warm: float) -> tuple[list[float], list[float]]:
        """Simulated seconds from each death to the first poll that no longer served
        the proxy, and from each return to the first that served it again."""
        world = self.world
        assert world.churn is not None
        detect, revive = [], []
        for i, downs in enumerate(world.churn.downs):
            polls = self.seen[i]
            for d in downs:
                died = world.churn_t0 + d.start_ms / 1000 / world.speed
                back = world.churn_t0 + d.end_ms / 1000 / world.speed
                if died >= warm:
                    gone = next((t for t, s in polls if died <= t < back and not s), None)
                    if gone is not None:
                        detect.append((gone - died) * world.speed)
                if back >= warm and d.end_ms < world.churn.duration_ms:
                    again = next((t for t, s in polls if t >= back and s), None)
                    if again is not None:
                        revive.append((again - back) * world.speed)
        return detect, revive

    def _figures(self, warm: float, agents: Any) -> dict[str, Any]:
        detect, revive = self._latencies(warm)
        checks = 0
        for a in agents.get("agents", []):
            if a.get("role") == "checker":
                events = a.get("counts", {})
                checks += events.get("ProxyWorked", 0) + events.get("ProxyFailed", 0)
        return {
            "served_tried": self.tried,
            "served_precision": round(self.worked / self.tried, 3) if self.tried else None,
            "served_failed_while_up": self.failed_while_up,
            "recall": round(statistics.mean(self.recall), 3) if self.recall else None,
            "detection_s_median": _q(detect, 0.5),
            "detection_s_p90": _q(detect, 0.9),
            "deaths_detected": len(detect),
            "revival_s_median": _q(revive, 0.5),
            "revival_s_p90": _q(revive, 0.9),
            "returns_seen": len(revive),
            "checks": checks,
            **self._outage(),
        }

    def _outage(self) -> dict[str, Any]:
        """For a profile with a mass death (``outage``), in simulated seconds from it:
        how long the dead half took to leave ``alive`` (median, p90, and how many never
        did), when the served precision (over three polls) was back at 0.95, and the
        longest a proxy up and served (``alive``) at that moment was then not served
        before its own next death. (One up but not in the pool then, such as a proxy
        that was down when its page was first checked, was not taken out of ``alive``
        by the outage: it is counted apart, ``outage_others_not_served_then``.)"""
        world = self.world
        assert world.churn is not None
        share = PROFILES[world.churn.profile].mass_death_at
        if share is None:
            return {}
        speed, t0 = world.speed, world.churn_t0
        mass_ms = int(world.churn.duration_ms * share)
        at = t0 + mass_ms / 1000 / speed
        plan = world.churn
        # The half the mass death took (up until it), and the rest up at that moment,
        # each until its own next death.
        died = {
            i
            for i, downs in enumerate(plan.downs)
            if plan.up(i, mass_ms - 1)
            and any(d.start_ms <= mass_ms and d.end_ms >= plan.duration_ms for d in downs)
        }
        stays = {
            i: t0
            + min([d.start_ms for d in downs if d.start_ms > mass_ms] or [plan.duration_ms])
            / 1000
            / speed
            for i, downs in enumerate(plan.downs)
            if i not in died and plan.up(i, mass_ms)
        }
        absent = {i for i in stays if not _served_before(self.seen[i], at)}
        for i in absent:
            del stays[i]
        gone, never = [], 0
        for i in died:
            served_then = [s for t, s in self.seen[i] if t >= at]
            left = next((t for t, s in self.seen[i] if t >= at and not s), None)
            if left is None:
                never += bool(served_then)
            else:
                gone.append((left - at) * speed)
        back = None
        after = [p for p in self.polls if p[0] >= at]
        for k in range(len(after) - 2):
            window = after[k : k + 3]
            tried = sum(p[1] for p in window)
            if tried and sum(p[2] for p in window) / tried >= 0.95:
                back = round((window[-1][0] - at) * speed, 1)
                break
        longest = 0.0
        for i, until in stays.items():
            start = None
            for t, s in self.seen[i]:
                if at <= t < until and not s:
                    start = t if start is None else start
                    longest = max(longest, (t - start) * speed)
                else:
                    start = None
        return {
            "outage_killed": len(died),
            "outage_others_up": len(stays) + len(absent),
            "outage_others_not_served_then": len(absent),
            "outage_gone_s_median": _q(gone, 0.5),
            "outage_gone_s_p90": _q(gone, 0.9),
            "outage_never_gone": never,
            "outage_precision_095_after_s": back,
            "outage_others_longest_unserved_s": round(longest, 1),
        }


def _served_before(polls: list[tuple[float, bool]], at: float) -> bool:
    """Whether the last poll before ``at`` served the proxy."""
    before = [s for t, s in polls if t < at]
    return bool(before) and before[-1]


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 1)
