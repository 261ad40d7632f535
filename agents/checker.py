"""The checker: lease recheck shards, re-test the proxies that are due, report both ways.

The gateway's lease payload lists the shard's due proxies (graduated intervals, spread
across ASNs: projections/recheck.py). Shards go through a pipeline: leased while fewer
than ``batch`` proxies are in flight, each proxy tested with the protocol it was
confirmed with, ``ProxyWorked`` or ``ProxyFailed`` published under its lease as each
check ends, and each shard released when its own checks end, so a slow check holds
only its shard, not every other one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from agents.check import Check
from agents.gateway_client import GatewayClient
from agents.judgepool import JudgePool
from agents.loop import Agent, AgentConfig, run_cycles
from events import Event, ProxyFailed
from events.wire import LeaseGrant

__all__ = ["Checker", "CheckerConfig"]

log = structlog.get_logger("ppf.checker")


@dataclass(frozen=True, slots=True)
class CheckerConfig(AgentConfig):
    shards: int = 8  # shards leased at a time
    # A cycle leases shards until it holds this many due proxies (or no shard has any):
    # with a small pool a shard holds one proxy or none, and eight a cycle, each cycle
    # as long as its slowest check, rechecked 200 proxies about three times an hour
    # whatever the intervals asked (BENCHMARKS.md, issue 12).
    batch: int = 500
    max_shards: int = 64  # the gateway's leases per agent


class Checker(Agent):
    config: CheckerConfig

    def __init__(
        self,
        gateway: str,
        token: str,
        name: str,
        judges: str | Sequence[str],
        data: Path,
        config: CheckerConfig,
    ) -> None:
        super().__init__(gateway, token, name, judges, data, config)
        self.rechecked = 0
        self.voided = 0  # cycles thrown away because the judge did not answer
        self.peak = 0  # most proxies in flight at once

    async def run(self, stop: asyncio.Event, *, cycles: int | None = None) -> None:
        async with self._gateway_client() as gw, self._judges() as judge:
            self.cycles += await run_cycles(
                self.name,
                lambda: self.cycle(gw, judge),
                stop,
                idle_s=self.config.idle_s,
                cycles=cycles,
            )

    async def cycle(self, gw: GatewayClient, judge: JudgePool) -> int:
        """Shards in a pipeline: each is checked, reported and released on its own, and
        new ones are leased as old ones end, while fewer than ``batch`` proxies and
        ``max_shards`` shards are in flight. The cycle ends when nothing is in flight and
        nothing more is leased: none is due, a shard done this cycle is due again (a
        round), or a shard came out void (our judges are down). Returns the shards done."""
        cfg = self.config
        await gw.flush()  # observations buffered while the log was away go first
        if await self._outage(gw, judge):
            return 0
        flight: dict[asyncio.Task[bool], int] = {}  # shard's task -> its proxies
        seen: set[str] = set()  # shards leased this cycle
        done = 0
        void = False
        rounded = False  # a shard came due again: this round is done, lease no more
        asked_empty = -1e9  # when the gateway last had no due shard for us
        async with self._streaming(gw) as out:
            while True:
                held = sum(flight.values())
                room = min(cfg.shards, cfg.max_shards - len(flight))
                quiet = time.monotonic() - asked_empty < 1.0
                if not (void or rounded) and room > 0 and held < cfg.batch and not quiet:
                    grants = await gw.lease("recheck", room, cfg.lease_ttl_s)
                    if not grants:
                        asked_empty = time.monotonic()
                    for grant in grants:
                        if grant.target in seen:
                            rounded = True  # due again already: the next cycle's
                            await gw.release(grant.lease, "abandoned", "next round", counted=False)
                            continue
                        seen.add(grant.target)
                        proxies = grant.recheck().proxies
                        task = asyncio.create_task(self._shard(gw, judge, grant, out))
                        flight[task] = len(proxies)
                    self.peak = max(self.peak, sum(flight.values()))
                    if grants and not rounded:
                        continue  # fill up before waiting
                if not flight:
                    break
                timeout = None if void or rounded or held >= cfg.batch else 1.0
                ended, _ = await asyncio.wait(
                    flight, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for task in ended:
                    del flight[task]
                    if task.result():
                        done += 1
                    else:
                        void = True
        if void:
            # Our judges are down, not their proxies: failures now would mark a healthy
            # pool dead, so none was said, and the void shards went back uncounted.
            log.warning("recheck_void", agent=self.name, reason="no judge answers")
            self.voided += 1
            return 0  # no work done: wait before asking again
        return done

    async def _shard(
        self, gw: GatewayClient, judge: JudgePool, grant: LeaseGrant, out: list[Event]
    ) -> bool:
        """Check one shard's due proxies, results into ``out`` as each check ends;
        release it. False when it was void (every failure explained by the judge)."""
        targets = [(ip, port, known or None) for ip, port, known in grant.recheck().proxies]

        def heard(i: int, r: Check) -> None:
            ip, port, proto = targets[i]
            if r.ok and r.proto is not None:
                out.append(self._worked(ip, port, r, grant.lease))
            elif not r.void:  # a judge's failure says nothing of the proxy
                out.append(
                    self._ev(
                        ProxyFailed, ip=ip, port=port, proto=proto or "", error=r.error,
                        lease=grant.lease,
                    )
                )  # fmt: skip

        async with self._heartbeats(gw, [grant]):  # a shard of tarpits outlasts its lease
            results = await self._check(targets, judge, on_result=heard)
        failed = [r for r in results if not r.ok]
        if failed and all(r.void for r in failed):
            await gw.release(grant.lease, "abandoned", "judge unreachable", counted=False)
            return False
        await gw.release(grant.lease, "done")
        self.rechecked += len(targets)
        log.debug(
            "recheck_done",
            agent=self.name,
            shard=grant.target,
            proxies=len(targets),
            working=sum(r.ok for r in results),
        )
        return True
